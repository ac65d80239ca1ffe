//! The local APIC in x2APIC mode (MSR interface; privileged, so via the nub).

use crate::arch::nub;
use hover_abi::vectors::SPURIOUS;

const IA32_APIC_BASE: u32 = 0x1b;
const APIC_BASE_ENABLE: u64 = 1 << 11;
const APIC_BASE_X2APIC: u64 = 1 << 10;
const X2APIC_ID: u32 = 0x802;
const X2APIC_SVR: u32 = 0x80f;
const SVR_ENABLE: u64 = 1 << 8;

/// Switch this CPU's LAPIC to x2APIC mode and software-enable it.
pub fn enable() {
    let base = nub::rdmsr(IA32_APIC_BASE);
    nub::wrmsr(IA32_APIC_BASE, base | APIC_BASE_ENABLE | APIC_BASE_X2APIC);
    nub::wrmsr(X2APIC_SVR, SVR_ENABLE | SPURIOUS as u64);
}

/// This CPU's x2APIC id.
pub fn id() -> u32 {
    nub::rdmsr(X2APIC_ID) as u32
}
