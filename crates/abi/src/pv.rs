//! KVM paravirtual interface numbers (Linux `arch/x86/include/uapi/asm/kvm_para.h`,
//! `Documentation/virt/kvm/x86/msr.rst`), used by both the monitor (to expose
//! features) and the guest (to use them).

/// CPUID leaf whose EAX lists the KVM PV features.
pub const CPUID_KVM_FEATURES: u32 = 0x4000_0001;
/// CPUID leaf with the "KVMKVMKVM" signature.
pub const CPUID_KVM_SIGNATURE: u32 = 0x4000_0000;

/// kvmclock through the new MSRs.
pub const FEATURE_CLOCKSOURCE2: u32 = 1 << 3;
/// Asynchronous page faults.
pub const FEATURE_ASYNC_PF: u32 = 1 << 4;
/// Steal-time accounting.
pub const FEATURE_STEAL_TIME: u32 = 1 << 5;
/// Paravirtual end-of-interrupt.
pub const FEATURE_PV_EOI: u32 = 1 << 6;
/// Async page faults also while the guest runs nested (not used by Hover).
pub const FEATURE_ASYNC_PF_VMEXIT: u32 = 1 << 10;
/// "Page ready" delivered as an interrupt rather than a #PF.
pub const FEATURE_ASYNC_PF_INT: u32 = 1 << 14;
/// The guest may turn host-side halt polling off while it polls itself
/// (`MSR_KVM_POLL_CONTROL`): what Linux's `cpuidle-haltpoll` uses.
pub const FEATURE_POLL_CONTROL: u32 = 1 << 12;

/// `KVM_HINTS_REALTIME` (CPUID 0x4000_0001 EDX): the vCPUs are never
/// preempted. Linux loads `cpuidle-haltpoll` (guest-side halt polling) only
/// with it, and also drops its paravirtual spinlocks and TLB flushes.
pub const HINT_REALTIME: u32 = 1 << 0;

/// `MSR_KVM_SYSTEM_TIME_NEW`: kvmclock area gpa | enable.
pub const MSR_KVM_SYSTEM_TIME_NEW: u32 = 0x4b56_4d01;
/// `MSR_KVM_ASYNC_PF_EN`: 64-byte aligned area gpa | flags.
pub const MSR_KVM_ASYNC_PF_EN: u32 = 0x4b56_4d02;
/// `MSR_KVM_ASYNC_PF_INT`: vector for "page ready".
pub const MSR_KVM_ASYNC_PF_INT: u32 = 0x4b56_4d06;
/// `MSR_KVM_ASYNC_PF_ACK`: write 1 after consuming a "page ready" token.
pub const MSR_KVM_ASYNC_PF_ACK: u32 = 0x4b56_4d07;

/// `MSR_KVM_ASYNC_PF_EN` bit: enable async page faults.
pub const ASYNC_PF_ENABLED: u64 = 1 << 0;
/// `MSR_KVM_ASYNC_PF_EN` bit: also in guest kernel mode (not used by Hover's guest).
pub const ASYNC_PF_SEND_ALWAYS: u64 = 1 << 1;
/// `MSR_KVM_ASYNC_PF_EN` bit: "page ready" as an interrupt (required with ASYNC_PF_INT).
pub const ASYNC_PF_DELIVERY_AS_INT: u64 = 1 << 3;
/// "Page not present" reason in the async-PF area's `flags` word.
pub const ASYNC_PF_FLAG_NOT_PRESENT: u32 = 1;
/// Token that wakes every waiter (sent after async PF is (re-)enabled).
pub const ASYNC_PF_BROADCAST_TOKEN: u32 = 0xffff_ffff;
