//! Interrupt vectors of the built-in guest that the monitor needs to know.

/// The guest's LAPIC timer (scheduler tick and sleeper deadlines).
pub const TIMER: u8 = 0x40;
/// First vector the guest routes to waiting tasks (device MSIs, irqfds).
pub const DEVICE_BASE: u8 = 0x50;
/// Number of device vectors, starting at [`DEVICE_BASE`].
pub const DEVICE_COUNT: u8 = 16;
/// KVM async page fault "page ready" notification (`MSR_KVM_ASYNC_PF_INT`).
pub const ASYNC_PF_READY: u8 = 0xe0;
/// Cross-vCPU reschedule IPI.
pub const RESCHED: u8 = 0xf1;
/// Spurious-interrupt vector (x2APIC SVR).
pub const SPURIOUS: u8 = 0xff;

/// Whether `v` is one of the device vectors.
pub const fn is_device(v: u8) -> bool {
    v >= DEVICE_BASE && v < DEVICE_BASE + DEVICE_COUNT
}
