//! The state every vCPU starts in: 64-bit long mode at CPL0 with paging on,
//! the guest's entry point in RIP, the boot-info page in RDI and the vCPU
//! index in RSI (docs/ABI.md, "Entry state").

use hover_abi::layout::{BOOT_GDT_GPA, BOOT_INFO_GPA, KERNEL_CS, KERNEL_DS, PML4_GPA, TSS_SEL};
use kvm_bindings::{kvm_fpu, kvm_regs, kvm_segment, kvm_sregs};

use super::tables::{boot_stack_top, boot_tss, BOOT_TSS_LIMIT};

use hover_abi::boot::cr::{CR0_ET, CR0_PE};
pub use hover_abi::boot::{ENTRY_CR0, ENTRY_CR4, ENTRY_EFER};

/// A flat 4 GiB CPL0 segment: code (64-bit in long mode, else 32-bit) or data.
fn flat_segment(selector: u16, code: bool, long_mode: bool) -> kvm_segment {
    let code64 = code && long_mode;
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_: if code { 0xb } else { 0x3 },
        present: 1,
        dpl: 0,
        db: u8::from(!code64),
        s: 1,
        l: u8::from(code64),
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// Both entry states' segments at CPL0 (code 64-bit in long mode, else
/// 32-bit; every data segment flat), the placeholder GDT and an empty IDT.
fn flat_segments(s: &mut kvm_sregs, long_mode: bool) {
    s.cs = flat_segment(KERNEL_CS, true, long_mode);
    s.ds = flat_segment(KERNEL_DS, false, long_mode);
    s.es = s.ds;
    s.fs = s.ds;
    s.gs = s.ds;
    s.ss = s.ds;
    s.gdt.base = BOOT_GDT_GPA;
    s.gdt.limit = (hover_abi::layout::GDT_ENTRIES * 8 - 1) as u16;
    s.idt.base = 0;
    s.idt.limit = 0;
}

/// Special registers for vCPU `index`, starting from what KVM reported.
pub fn sregs(mut s: kvm_sregs, index: u32) -> kvm_sregs {
    flat_segments(&mut s, true);
    s.tr = kvm_segment {
        base: boot_tss(index),
        limit: BOOT_TSS_LIMIT,
        selector: TSS_SEL,
        type_: 0xb, // busy 64-bit TSS
        present: 1,
        ..Default::default()
    };
    s.cr0 = ENTRY_CR0;
    s.cr3 = PML4_GPA;
    s.cr4 = ENTRY_CR4;
    s.efer = ENTRY_EFER;
    s
}

/// General registers for vCPU `index` entering at `entry`.
pub fn regs(entry: u64, index: u32) -> kvm_regs {
    kvm_regs {
        rip: entry,
        rsp: boot_stack_top(index),
        rdi: BOOT_INFO_GPA,
        rsi: index as u64,
        rflags: 0x2,
        ..Default::default()
    }
}

/// Special registers for the Linux boot protocol's 64-bit entry: long mode
/// with the boot page tables (every RAM page identity-mapped), flat CPL0
/// segments, and only PAE in CR4 (the kernel sets the rest itself).
pub fn linux_sregs(s: kvm_sregs, index: u32) -> kvm_sregs {
    let mut s = sregs(s, index);
    s.cr4 = hover_abi::boot::cr::CR4_PAE;
    s
}

/// General registers for the Linux 64-bit entry at `entry`: RSI = the zero page.
pub fn linux_regs(entry: u64, zero_page: u64, index: u32) -> kvm_regs {
    kvm_regs {
        rip: entry,
        rsi: zero_page,
        rsp: boot_stack_top(index),
        rflags: 0x2,
        ..Default::default()
    }
}

/// Special registers for the PVH entry (Xen's PVH boot ABI): 32-bit
/// protected mode, paging off, flat 4 GiB code and data segments at CPL0,
/// a 32-bit TSS; the guest builds long mode itself.
pub fn pvh_sregs(mut s: kvm_sregs) -> kvm_sregs {
    flat_segments(&mut s, false);
    s.tr = kvm_segment {
        base: 0,
        limit: 0x67,
        selector: 0,
        type_: 0xb, // busy 32-bit TSS
        present: 1,
        ..Default::default()
    };
    s.cr0 = CR0_PE | CR0_ET;
    s.cr3 = 0;
    s.cr4 = 0;
    s.efer = 0;
    s
}

/// General registers for the PVH entry at `entry`: EBX = the start-info page.
pub fn pvh_regs(entry: u64, start_info: u64) -> kvm_regs {
    kvm_regs {
        rip: entry,
        rbx: start_info,
        rflags: 0x2,
        ..Default::default()
    }
}

/// x87/SSE state as after FNINIT, with all SSE exceptions masked.
pub fn fpu() -> kvm_fpu {
    kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_state_is_long_mode_cpl0() {
        let s = sregs(kvm_sregs::default(), 1);
        assert_eq!(s.cs.l, 1);
        assert_eq!(s.cs.dpl, 0);
        assert_eq!(s.cr3, PML4_GPA);
        assert_ne!(s.cr4 & hover_abi::boot::cr::CR4_OSFXSR, 0);
        assert_eq!(s.tr.base, boot_tss(1));
        let r = regs(0x10_0000, 1);
        assert_eq!((r.rip, r.rdi, r.rsi), (0x10_0000, BOOT_INFO_GPA, 1));
        assert_eq!(r.rsp % 16, 0);
    }
}
