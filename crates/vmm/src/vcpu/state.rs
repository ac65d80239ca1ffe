//! A vCPU's whole state: read from a paused vCPU, loaded into a new one.
//!
//! What is saved: registers, SREGS2 (SREGS where KVM lacks it), FPU and
//! XSAVE, XCRs, every MSR KVM lists (`KVM_GET_MSR_INDEX_LIST`, plus the KVM
//! PV MSRs for kvmclock and async PF), the LAPIC, pending events, the MP
//! state, debug registers, CPUID and the TSC rate. The order of loading is
//! the one measured to work on this KVM (docs/PLATFORM.md):
//! CPUID, TSC rate, SREGS2, REGS, FPU, XSAVE, XCRS, MSRS, LAPIC, then
//! TSC_DEADLINE again (KVM drops a deadline written before the LAPIC),
//! events, MP state, debug registers.
//!
//! One field is adjusted on the way in: on an AMD host the task register
//! is loaded as an available TSS (type 9) rather than the busy one (11)
//! KVM reports there (see [`tss_type_for_host`]).

use kvm_bindings::{
    kvm_cpuid_entry2, kvm_debugregs, kvm_fpu, kvm_lapic_state, kvm_mp_state, kvm_msr_entry,
    kvm_regs, kvm_sregs, kvm_sregs2, kvm_vcpu_events, kvm_xcrs, CpuId, Msrs, Xsave, KVM_CAP_SREGS2,
    KVM_CAP_XSAVE2, KVM_MAX_CPUID_ENTRIES, KVM_VCPUEVENT_VALID_NMI_PENDING,
    KVM_VCPUEVENT_VALID_SIPI_VECTOR,
};
use kvm_ioctls::{Kvm, VmFd};
use serde::{Deserialize, Serialize};
use vmm_sys_util::ioctl::{ioctl_with_mut_ref, ioctl_with_ref};

use super::Vcpu;
use crate::arch::x86_64::cpuid::host_is_amd;

/// `KVM_GET_SREGS2`/`KVM_SET_SREGS2`, which kvm-ioctls lacks.
mod sregs2 {
    #![allow(missing_docs)]
    use kvm_bindings::{kvm_sregs2, KVMIO};
    use vmm_sys_util::{ioctl_ior_nr, ioctl_iow_nr};
    ioctl_ior_nr!(KVM_GET_SREGS2, KVMIO, 0xcc, kvm_sregs2);
    ioctl_iow_nr!(KVM_SET_SREGS2, KVMIO, 0xcd, kvm_sregs2);
}
use sregs2::{KVM_GET_SREGS2, KVM_SET_SREGS2};

/// `IA32_TSC_DEADLINE`.
const MSR_TSC_DEADLINE: u32 = 0x6e0;
/// KVM's PV MSRs (kvmclock, async PF, steal time, PV EOI, poll control),
/// saved even where the index list leaves them out.
const PV_MSRS: [u32; 8] = [
    0x4b56_4d00,
    0x4b56_4d01,
    0x4b56_4d02,
    0x4b56_4d03,
    0x4b56_4d04,
    0x4b56_4d05,
    0x4b56_4d06,
    0x4b56_4d07,
];
/// A 64-bit TSS descriptor type, available and busy.
const TSS_AVAILABLE: u8 = 9;
const TSS_BUSY: u8 = 11;

/// The task register's type to load on this host: on AMD (`amd`), a
/// saved busy TSS is loaded as available.
///
/// Why: SVM's VMCB does not keep the busy bit, so KVM's `svm_get_segment`
/// always reports TR busy. Loaded back as busy, the hidden TR differs from
/// the one the guest's own `ltr` left, and an emulated SVM (QEMU's TCG, the
/// KVM lab's L1: docs/LAB.md) then refuses every CPL3 port access through
/// the TSS's I/O bitmap with #GP, as its `check_io` requires type 9: the
/// built-in guest's first report after a restore triple-faulted there. AMD
/// hardware ignores the type in 64-bit mode (no task switches; the I/O
/// check reads only the base and limit). On Intel, VM entry requires a
/// busy TR, so it stays as saved.
pub fn tss_type_for_host(saved: u8, amd: bool) -> u8 {
    if amd && saved == TSS_BUSY {
        TSS_AVAILABLE
    } else {
        saved
    }
}

/// Size of the legacy `kvm_xsave` region, bytes.
const XSAVE_LEGACY_BYTES: usize = 4096;

/// Why a vCPU's state could not be read or loaded.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The vCPU is running; pause it first.
    #[error("the vCPU is not paused")]
    NotPaused,
    /// A KVM call failed.
    #[error("{op} failed: {source}")]
    Kvm {
        /// The ioctl.
        op: &'static str,
        /// KVM's error.
        source: kvm_ioctls::Error,
    },
    /// The saved state does not fit this vCPU.
    #[error("{0}")]
    Mismatch(String),
    /// The vCPU's thread has ended (it panicked).
    #[error("the vCPU's thread has ended")]
    ThreadGone,
}

fn kvm(op: &'static str) -> impl Fn(kvm_ioctls::Error) -> StateError {
    move |source| StateError::Kvm { op, source }
}

/// Which state this host's vCPUs have: the same for every vCPU of a VM.
#[derive(Clone, Debug)]
pub struct StateLayout {
    /// MSRs to save.
    pub msrs: Vec<u32>,
    /// Whether KVM has `KVM_GET_SREGS2`.
    pub sregs2: bool,
    /// Bytes of XSAVE state (`KVM_CAP_XSAVE2`; 4096 without it).
    pub xsave_bytes: usize,
}

impl StateLayout {
    /// Ask KVM.
    pub fn probe(system: &Kvm, vm: &VmFd) -> Result<StateLayout, StateError> {
        let mut msrs: Vec<u32> = system
            .get_msr_index_list()
            .map_err(kvm("KVM_GET_MSR_INDEX_LIST"))?
            .as_slice()
            .to_vec();
        for m in PV_MSRS.into_iter().chain([MSR_TSC_DEADLINE]) {
            if !msrs.contains(&m) {
                msrs.push(m);
            }
        }
        let xsave2 = vm.check_extension_raw(KVM_CAP_XSAVE2 as libc::c_ulong);
        Ok(StateLayout {
            msrs,
            sregs2: vm.check_extension_raw(KVM_CAP_SREGS2 as libc::c_ulong) > 0,
            xsave_bytes: (xsave2 as usize).max(XSAVE_LEGACY_BYTES),
        })
    }
}

/// Special registers: SREGS2 (with the PDPTRs) where KVM has it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum SpecialRegs {
    /// `struct kvm_sregs2`, as bytes.
    Sregs2(Vec<u8>),
    /// `struct kvm_sregs`.
    Sregs(Box<kvm_sregs>),
}

/// One vCPU's whole state.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VcpuState {
    /// The CPUID table the vCPU had.
    pub cpuid: Vec<kvm_cpuid_entry2>,
    /// TSC rate, kHz.
    pub tsc_khz: u32,
    /// Special registers.
    pub sregs: SpecialRegs,
    /// General registers.
    pub regs: kvm_regs,
    /// `struct kvm_fpu`, as bytes.
    pub fpu: Vec<u8>,
    /// XSAVE area (`KVM_GET_XSAVE2` layout), as 32-bit words.
    pub xsave: Vec<u32>,
    /// Extended control registers.
    pub xcrs: kvm_xcrs,
    /// Every MSR KVM could read.
    pub msrs: Vec<kvm_msr_entry>,
    /// The local APIC.
    pub lapic: kvm_lapic_state,
    /// Pending exceptions, interrupts, NMIs, SMIs.
    pub events: kvm_vcpu_events,
    /// Runnable, halted, ...
    pub mp_state: kvm_mp_state,
    /// Debug registers.
    pub debugregs: kvm_debugregs,
}

/// The bytes of a KVM structure with no serde support.
fn pod_bytes<T: Copy>(v: &T) -> Vec<u8> {
    // SAFETY: T is a bindgen-generated plain-old-data KVM structure; reading
    // its bytes (padding included, zero-initialised by Default) is sound.
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>()) }
        .to_vec()
}

/// A KVM structure from its bytes.
fn pod_from<T: Copy + Default>(b: &[u8], what: &str) -> Result<T, StateError> {
    if b.len() != std::mem::size_of::<T>() {
        return Err(StateError::Mismatch(format!(
            "{what} is {} bytes, this host's KVM uses {}",
            b.len(),
            std::mem::size_of::<T>()
        )));
    }
    // SAFETY: the length matches, and every bit pattern is a valid value of
    // these plain-old-data KVM structures.
    Ok(unsafe { std::ptr::read_unaligned(b.as_ptr() as *const T) })
}

/// Read or write `msrs` in as many calls as needed: KVM stops at the first
/// MSR it refuses, which is skipped. Returns the entries done and the indices refused.
fn msr_io(
    entries: &[kvm_msr_entry],
    mut call: impl FnMut(&mut Msrs) -> Result<usize, kvm_ioctls::Error>,
    op: &'static str,
) -> Result<(Vec<kvm_msr_entry>, Vec<u32>), StateError> {
    let (mut done, mut refused, mut at) = (Vec::new(), Vec::new(), 0);
    while at < entries.len() {
        let mut m = Msrs::from_entries(&entries[at..])
            .map_err(|e| StateError::Mismatch(format!("{op}: {e:?}")))?;
        let n = call(&mut m).map_err(kvm(op))?;
        done.extend_from_slice(&m.as_slice()[..n]);
        at += n;
        if at < entries.len() {
            refused.push(entries[at].index);
            at += 1;
        }
    }
    Ok((done, refused))
}

impl Vcpu {
    /// Read the whole state (the vCPU must not be in `KVM_RUN`).
    pub fn save_state(&self) -> Result<VcpuState, StateError> {
        let fd = &self.fd;
        // First: KVM_GET_MP_STATE delivers a pending INIT or SIPI, which
        // changes the registers (an application processor a PVH guest is
        // starting jumps to its trampoline). Read after them, the state
        // would pair RUNNABLE with the reset CS:IP.
        let mp_state = fd.get_mp_state().map_err(kvm("KVM_GET_MP_STATE"))?;
        let sregs = if self.layout.sregs2 {
            let mut s = kvm_sregs2::default();
            // SAFETY: KVM_GET_SREGS2 fills a kvm_sregs2 of the size encoded
            // in the ioctl number; the result is checked.
            let rc = unsafe { ioctl_with_mut_ref(fd, KVM_GET_SREGS2(), &mut s) };
            if rc < 0 {
                return Err(kvm("KVM_GET_SREGS2")(kvm_ioctls::Error::last()));
            }
            SpecialRegs::Sregs2(pod_bytes(&s))
        } else {
            SpecialRegs::Sregs(Box::new(fd.get_sregs().map_err(kvm("KVM_GET_SREGS"))?))
        };
        let wanted: Vec<kvm_msr_entry> = self
            .layout
            .msrs
            .iter()
            .map(|&index| kvm_msr_entry {
                index,
                ..Default::default()
            })
            .collect();
        let (msrs, _) = msr_io(&wanted, |m| fd.get_msrs(m), "KVM_GET_MSRS")?;
        Ok(VcpuState {
            cpuid: fd
                .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
                .map_err(kvm("KVM_GET_CPUID2"))?
                .as_slice()
                .to_vec(),
            tsc_khz: fd.get_tsc_khz().map_err(kvm("KVM_GET_TSC_KHZ"))?,
            sregs,
            regs: fd.get_regs().map_err(kvm("KVM_GET_REGS"))?,
            fpu: pod_bytes(&fd.get_fpu().map_err(kvm("KVM_GET_FPU"))?),
            xsave: self.get_xsave()?,
            xcrs: fd.get_xcrs().map_err(kvm("KVM_GET_XCRS"))?,
            msrs,
            lapic: fd.get_lapic().map_err(kvm("KVM_GET_LAPIC"))?,
            events: fd.get_vcpu_events().map_err(kvm("KVM_GET_VCPU_EVENTS"))?,
            mp_state,
            debugregs: fd.get_debug_regs().map_err(kvm("KVM_GET_DEBUGREGS"))?,
        })
    }

    fn xsave_words(&self) -> usize {
        self.layout.xsave_bytes / 4
    }

    fn get_xsave(&self) -> Result<Vec<u32>, StateError> {
        let extra = self.xsave_words() - XSAVE_LEGACY_BYTES / 4;
        if extra == 0 {
            let x = self.fd.get_xsave().map_err(kvm("KVM_GET_XSAVE"))?;
            return Ok(x.region.to_vec());
        }
        let mut x = Xsave::new(extra).map_err(|e| StateError::Mismatch(format!("{e:?}")))?;
        // SAFETY: the buffer holds KVM_CAP_XSAVE2 bytes, as KVM_GET_XSAVE2 requires.
        unsafe { self.fd.get_xsave2(&mut x) }.map_err(kvm("KVM_GET_XSAVE2"))?;
        let mut words = x.as_fam_struct_ref().xsave.region.to_vec();
        words.extend_from_slice(x.as_slice());
        Ok(words)
    }

    fn set_xsave(&self, words: &[u32]) -> Result<(), StateError> {
        if words.len() != self.xsave_words() {
            return Err(StateError::Mismatch(format!(
                "the XSAVE area is {} bytes, this host's is {}",
                words.len() * 4,
                self.layout.xsave_bytes
            )));
        }
        let (legacy, extra) = words.split_at(XSAVE_LEGACY_BYTES / 4);
        let mut x = Xsave::new(extra.len()).map_err(|e| StateError::Mismatch(format!("{e:?}")))?;
        x.as_mut_slice().copy_from_slice(extra);
        // SAFETY: only the region is written; the FAM header stays as built.
        unsafe { x.as_mut_fam_struct() }
            .xsave
            .region
            .copy_from_slice(legacy);
        // SAFETY: the buffer holds the whole XSAVE2-sized area.
        unsafe { self.fd.set_xsave2(&x) }.map_err(kvm("KVM_SET_XSAVE"))
    }

    /// Load `s` (the vCPU must not be in `KVM_RUN`), in the order that works.
    pub fn restore_state(&self, s: &VcpuState) -> Result<(), StateError> {
        let fd = &self.fd;
        let cpuid = CpuId::from_entries(&s.cpuid)
            .map_err(|e| StateError::Mismatch(format!("bad CPUID table: {e:?}")))?;
        fd.set_cpuid2(&cpuid).map_err(kvm("KVM_SET_CPUID2"))?;
        fd.set_tsc_khz(s.tsc_khz).map_err(kvm("KVM_SET_TSC_KHZ"))?;
        match &s.sregs {
            SpecialRegs::Sregs2(b) => {
                if !self.layout.sregs2 {
                    return Err(StateError::Mismatch(
                        "the state has SREGS2, which this host's KVM lacks".into(),
                    ));
                }
                let mut s2: kvm_sregs2 = pod_from(b, "SREGS2")?;
                s2.tr.type_ = tss_type_for_host(s2.tr.type_, host_is_amd());
                // SAFETY: KVM_SET_SREGS2 reads a kvm_sregs2; the result is checked.
                let rc = unsafe { ioctl_with_ref(fd, KVM_SET_SREGS2(), &s2) };
                if rc < 0 {
                    return Err(kvm("KVM_SET_SREGS2")(kvm_ioctls::Error::last()));
                }
            }
            SpecialRegs::Sregs(r) => {
                let mut r = **r;
                r.tr.type_ = tss_type_for_host(r.tr.type_, host_is_amd());
                fd.set_sregs(&r).map_err(kvm("KVM_SET_SREGS"))?
            }
        }
        fd.set_regs(&s.regs).map_err(kvm("KVM_SET_REGS"))?;
        fd.set_fpu(&pod_from::<kvm_fpu>(&s.fpu, "FPU state")?)
            .map_err(kvm("KVM_SET_FPU"))?;
        self.set_xsave(&s.xsave)?;
        fd.set_xcrs(&s.xcrs).map_err(kvm("KVM_SET_XCRS"))?;
        let (_, refused) = msr_io(&s.msrs, |m| fd.set_msrs(m), "KVM_SET_MSRS")?;
        if !refused.is_empty() {
            let list: Vec<String> = refused.iter().map(|i| format!("{i:#x}")).collect();
            return Err(StateError::Mismatch(format!(
                "KVM refused to restore MSRs {}",
                list.join(", ")
            )));
        }
        fd.set_lapic(&s.lapic).map_err(kvm("KVM_SET_LAPIC"))?;
        // A deadline written before the LAPIC is restored is dropped.
        if let Some(d) = s.msrs.iter().find(|m| m.index == MSR_TSC_DEADLINE) {
            let m =
                Msrs::from_entries(&[*d]).map_err(|e| StateError::Mismatch(format!("{e:?}")))?;
            fd.set_msrs(&m)
                .map_err(kvm("KVM_SET_MSRS (TSC deadline)"))?;
        }
        let mut events = s.events;
        events.flags |= KVM_VCPUEVENT_VALID_NMI_PENDING | KVM_VCPUEVENT_VALID_SIPI_VECTOR;
        fd.set_vcpu_events(&events)
            .map_err(kvm("KVM_SET_VCPU_EVENTS"))?;
        fd.set_mp_state(s.mp_state)
            .map_err(kvm("KVM_SET_MP_STATE"))?;
        fd.set_debug_regs(&s.debugregs)
            .map_err(kvm("KVM_SET_DEBUGREGS"))?;
        Ok(())
    }
}

/// The guest pages KVM reads or writes when a vCPU's `msrs` are loaded: the
/// areas a guest placed for kvmclock (wall clock and system time), async
/// PF, steal time and PV EOI (enabled ones only), ascending. A post-copy
/// destination loads the state before it serves any page on demand, so
/// these go with the pinned pages (a Linux guest puts them in its own
/// memory; the built-in guest in its boot area, pinned anyway).
pub fn pv_area_pages(msrs: &[kvm_msr_entry]) -> Vec<u64> {
    // (MSR, bits of the value that are flags, not address; the area's size)
    const AREAS: [(u32, u64, u64); 5] = [
        (0x4b56_4d00, 0, 12),    // MSR_KVM_WALL_CLOCK_NEW: written at once
        (0x4b56_4d01, 0x1, 32),  // MSR_KVM_SYSTEM_TIME_NEW
        (0x4b56_4d02, 0x3f, 64), // MSR_KVM_ASYNC_PF_EN
        (0x4b56_4d03, 0x3f, 64), // MSR_KVM_STEAL_TIME
        (0x4b56_4d04, 0x3, 4),   // MSR_KVM_PV_EOI_EN
    ];
    let page = hover_abi::layout::PAGE_SIZE;
    let mut out = Vec::new();
    for m in msrs {
        let Some(&(_, flags, size)) = AREAS.iter().find(|a| a.0 == m.index) else {
            continue;
        };
        // Enabled: bit 0 (the wall clock has no enable bit: any address).
        if m.data == 0 || (flags != 0 && m.data & 1 == 0) {
            continue;
        }
        let gpa = m.data & !flags;
        out.push(gpa / page * page);
        out.push(gpa.saturating_add(size - 1) / page * page);
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_tss_is_loaded_available_on_amd_only() {
        assert_eq!(tss_type_for_host(TSS_BUSY, true), TSS_AVAILABLE);
        assert_eq!(tss_type_for_host(TSS_BUSY, false), TSS_BUSY);
        assert_eq!(tss_type_for_host(TSS_AVAILABLE, true), TSS_AVAILABLE);
        assert_eq!(tss_type_for_host(TSS_AVAILABLE, false), TSS_AVAILABLE);
        // Other types (a 16-bit TSS, garbage) are KVM's to judge.
        assert_eq!(tss_type_for_host(3, true), 3);
    }

    #[test]
    fn the_pv_areas_a_guest_enabled_are_the_pages_its_state_load_touches() {
        let msr = |index, data| kvm_msr_entry {
            index,
            data,
            ..Default::default()
        };
        let msrs = [
            msr(0x10, 0x5000),                // not a PV area
            msr(0x4b56_4d00, 0x3_0ffc),       // wall clock straddling two pages
            msr(0x4b56_4d01, 0x7_1041),       // system time, enabled
            msr(0x4b56_4d02, 0x9_2000 | 0x3), // async PF, enabled with flags
            msr(0x4b56_4d03, 0xb_3040),       // steal time, not enabled
            msr(0x4b56_4d04, 0xd_4001),       // PV EOI, enabled
            msr(0x4b56_4d06, 0xec),           // a vector, not an address
        ];
        assert_eq!(
            pv_area_pages(&msrs),
            vec![0x3_0000, 0x3_1000, 0x7_1000, 0x9_2000, 0xd_4000]
        );
        assert!(pv_area_pages(&[msr(0x4b56_4d01, 0x7_1000)]).is_empty());
        assert!(pv_area_pages(&[msr(0x4b56_4d00, 0)]).is_empty());
    }

    #[test]
    fn pod_round_trip_and_size_check() {
        let mut s = kvm_sregs2 {
            cr3: 0x1234_5000,
            ..Default::default()
        };
        s.pdptrs[2] = 7;
        let b = pod_bytes(&s);
        let back: kvm_sregs2 = pod_from(&b, "SREGS2").unwrap();
        assert_eq!(back, s);
        let e = pod_from::<kvm_sregs2>(&b[1..], "SREGS2").unwrap_err();
        assert!(e.to_string().contains("SREGS2 is 319 bytes"), "{e}");
    }
}
