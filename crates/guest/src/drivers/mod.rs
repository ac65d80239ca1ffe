//! Devices: the serial console, Hover's control port, the paravirtual I/O
//! device and, under another VMM, a virtio block device.
//!
//! Imported by the boot sequence (`main.rs`), the arch layer and the kernel;
//! workloads reach what they need of it only through [`crate::kernel::api`].

pub mod console;
pub mod control;
pub mod pvio;
pub mod virtio_blk;
