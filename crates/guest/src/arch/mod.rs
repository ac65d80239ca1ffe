//! The x86-64 layer: the privileged nub (`nub.S`, the only CPL0 code, and
//! its CPL3 calls in `nub.rs`), task switching (`switch.S`, included by the
//! scheduler), descriptor tables, per-CPU state through the GS base, the
//! local APIC and the IOAPIC, the PVH entry, exception reporting and the C
//! memory functions.
//!
//! Imported by the boot sequence (`main.rs`), the kernel and the drivers;
//! workloads reach what they need of it only through [`crate::kernel::api`].

pub mod apic;
pub mod exception;
pub mod ioapic;
pub mod mem;
pub mod nub;
pub mod percpu;
pub mod pvh;
pub mod tables;
