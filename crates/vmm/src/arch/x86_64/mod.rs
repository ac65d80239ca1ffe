//! x86_64: CPUID, the boot page tables and descriptor tables, and the 64-bit
//! entry state every vCPU starts in.

pub mod cpuid;
pub mod entry;
pub mod pvh;
pub mod tables;
