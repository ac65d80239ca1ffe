//! x86_64: CPUID, the boot page tables and descriptor tables, the 64-bit
//! entry state every vCPU starts in, and reading the IOAPIC's routing.

pub mod acpi;
pub mod cpuid;
pub mod entry;
pub mod ioapic;
pub mod pvh;
pub mod tables;
