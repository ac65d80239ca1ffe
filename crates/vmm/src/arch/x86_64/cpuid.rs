//! The CPUID table each vCPU gets: what KVM supports, plus x2APIC and
//! TSC-deadline, per-vCPU APIC ids, and the KVM paravirtual leaf passed through.

use hover_abi::pv::CPUID_KVM_FEATURES;
use kvm_bindings::CpuId;

const LEAF_FEATURES: u32 = 1;
const LEAF_EXT_TOPOLOGY: u32 = 0xb;
const LEAF_V2_EXT_TOPOLOGY: u32 = 0x1f;
const ECX_X2APIC: u32 = 1 << 21;
const ECX_TSC_DEADLINE: u32 = 1 << 24;
const ECX_HYPERVISOR: u32 = 1 << 31;

/// Whether this host's CPU is AMD's (or Hygon's, its licensee): KVM runs
/// guests there through SVM, whose saved state differs in small ways from
/// VMX's (see `vcpu::state`).
pub fn host_is_amd() -> bool {
    // SAFETY: CPUID leaf 0 exists on every x86_64 CPU and has no side effects.
    #[allow(unused_unsafe)] // safe from Rust 1.94 on; unsafe before
    let r = unsafe { std::arch::x86_64::__cpuid(0) };
    let vendor = [r.ebx, r.edx, r.ecx];
    let bytes: Vec<u8> = vendor.iter().flat_map(|w| w.to_le_bytes()).collect();
    bytes == b"AuthenticAMD" || bytes == b"HygonGenuine"
}

/// Adjust KVM's supported CPUID for vCPU `index`, withholding the KVM PV
/// features in `pv_withheld` (CPUID 0x4000_0001 EAX bits) and giving the
/// hints `pv_hints` (its EDX).
pub fn for_vcpu(supported: &CpuId, index: u32, pv_withheld: u32, pv_hints: u32) -> CpuId {
    let mut cpuid = supported.clone();
    for e in cpuid.as_mut_slice() {
        match e.function {
            LEAF_FEATURES => {
                e.ecx |= ECX_X2APIC | ECX_TSC_DEADLINE | ECX_HYPERVISOR;
                e.ebx = (e.ebx & 0x00ff_ffff) | (index << 24);
            }
            LEAF_EXT_TOPOLOGY | LEAF_V2_EXT_TOPOLOGY => e.edx = index,
            CPUID_KVM_FEATURES => {
                e.eax &= !pv_withheld;
                e.edx = pv_hints;
            }
            _ => {}
        }
    }
    cpuid
}

/// The KVM paravirtual features (CPUID 0x4000_0001 EAX) in `cpuid`, or 0.
pub fn pv_features(cpuid: &CpuId) -> u32 {
    cpuid
        .as_slice()
        .iter()
        .find(|e| e.function == CPUID_KVM_FEATURES)
        .map_or(0, |e| e.eax)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::kvm_cpuid_entry2;

    fn table() -> CpuId {
        let entries = [
            kvm_cpuid_entry2 {
                function: 1,
                ebx: 0xff00_1234,
                ..Default::default()
            },
            kvm_cpuid_entry2 {
                function: 0xb,
                index: 1,
                edx: 0,
                ..Default::default()
            },
            kvm_cpuid_entry2 {
                function: CPUID_KVM_FEATURES,
                eax: 0x4010,
                ..Default::default()
            },
        ];
        CpuId::from_entries(&entries).unwrap()
    }

    #[test]
    fn per_vcpu_ids_and_apic_bits() {
        let c = for_vcpu(&table(), 3, 0, 0);
        let leaf1 = c.as_slice().iter().find(|e| e.function == 1).unwrap();
        assert_eq!(leaf1.ebx, 0x0300_1234);
        assert_ne!(leaf1.ecx & ECX_X2APIC, 0);
        assert_ne!(leaf1.ecx & ECX_TSC_DEADLINE, 0);
        assert_eq!(
            c.as_slice().iter().find(|e| e.function == 0xb).unwrap().edx,
            3
        );
        assert_eq!(pv_features(&c), 0x4010);
        assert_eq!(pv_features(&for_vcpu(&table(), 0, 0x4000, 0)), 0x10);
    }

    #[test]
    fn pv_hints_go_in_the_kvm_leafs_edx() {
        let kvm_edx = |c: &CpuId| {
            c.as_slice()
                .iter()
                .find(|e| e.function == CPUID_KVM_FEATURES)
                .unwrap()
                .edx
        };
        assert_eq!(kvm_edx(&for_vcpu(&table(), 0, 0, 0)), 0);
        let c = for_vcpu(&table(), 1, 0, hover_abi::pv::HINT_REALTIME);
        assert_eq!(kvm_edx(&c), 1);
        assert_eq!(pv_features(&c), 0x4010, "the features stay as they were");
    }
}
