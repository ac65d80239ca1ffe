//! What a request before the start names, checked before it is taken:
//! the machine's size, the kernel (a Linux kernel's header, or a guest of
//! Hover's own), the initrd, a snapshot's memory file. Each error is the
//! `fault_message` Firecracker's API answers with, naming the field.

use std::io::Read;
use std::path::Path;

use super::models::MachineConfiguration;
use super::refusal::Refusal;
use crate::config::{GuestImage, LinuxBoot};

/// Check a machine configuration against what Hover offers.
pub(super) fn check_machine(m: &MachineConfiguration) -> Result<(), Refusal> {
    let max = hover_abi::layout::MAX_VCPUS as u32;
    if m.vcpu_count == 0 || m.vcpu_count > max {
        return Err(Refusal(format!(
            "vcpu_count {} is out of range: give 1 to {max}",
            m.vcpu_count
        )));
    }
    if m.mem_size_mib == 0 || m.mem_size_mib > (1 << 20) {
        return Err(Refusal(format!(
            "mem_size_mib {} is out of range: give 1 to 1048576",
            m.mem_size_mib
        )));
    }
    if m.smt {
        return Err(Refusal::from(
            "smt: Hover presents no SMT siblings; give false",
        ));
    }
    if let Some(t) = &m.cpu_template {
        return Err(Refusal(format!(
            "cpu_template {}: Hover has no CPU templates (it passes the host's CPUID through, less what it hides itself); omit it",
            crate::api::quote(t)
        )));
    }
    Ok(())
}

/// Check that `path` is a guest Hover boots: a Linux kernel (a bzImage or
/// an x86-64 vmlinux; its header checked against `memory` bytes of RAM
/// now, the whole file when the microVM starts), the built-in guest's
/// bytes (its command line is then checked as `hover run` checks it), or
/// another x86-64 ELF executable of Hover's own kind.
pub(super) fn check_kernel(path: &Path, memory: u64) -> Result<GuestImage, Refusal> {
    let shown = path.display();
    let (mut f, meta) = crate::host::files::open_input(path).map_err(|e| {
        format!("kernel_image_path {shown}: {e} (give a Linux kernel, bzImage or vmlinux, or Hover's guest image)")
    })?;
    let mut head = Vec::with_capacity(4096);
    (&mut f)
        .take(4096)
        .read_to_end(&mut head)
        .map_err(|e| format!("kernel_image_path {shown}: {e}"))?;
    if crate::boot::linux::is_linux_kernel(&head) {
        crate::boot::linux::check_head(path, &head, memory)
            .map_err(|e| format!("kernel_image_path: {e}"))?;
        return Ok(GuestImage::Linux(LinuxBoot {
            kernel: path.into(),
            initrd: None,
        }));
    }
    if !head.starts_with(b"\x7fELF") {
        return Err(Refusal(format!(
            "kernel_image_path {shown} is neither a Linux kernel (bzImage or x86-64 vmlinux) nor an ELF executable of Hover's guest (`hover guest-image`)"
        )));
    }
    if meta.len() == crate::boot::BUILTIN_GUEST.len() as u64 {
        let mut bytes = head;
        f.take(meta.len())
            .read_to_end(&mut bytes)
            .map_err(|e| format!("kernel_image_path {shown}: {e}"))?;
        if bytes == crate::boot::BUILTIN_GUEST {
            return Ok(GuestImage::Builtin);
        }
    }
    let image = GuestImage::Path(path.into());
    let img = crate::boot::read_image(&image).map_err(|e| format!("kernel_image_path: {e}"))?;
    crate::boot::inspect(&img).map_err(|e| format!("kernel_image_path: {e}"))?;
    Ok(image)
}

/// Check that an initrd is a regular file that can be read (its size
/// against guest memory is checked at the start).
pub(super) fn check_initrd(path: &Path) -> Result<(), Refusal> {
    crate::host::files::open_input(path)
        .map(drop)
        .map_err(|e| Refusal(format!("initrd_path {}: {e}", path.display())))
}

/// Check that `mem` is the memory file `snapshot/create` wrote beside
/// `snap`: Hover keeps state and memory in one file and gives it both
/// names, so `mem` must be that file (the same inode) or a copy of it.
pub(super) fn same_snapshot(snap: &Path, mem: &Path) -> Result<(), Refusal> {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let open = |p: &Path, what: &str| {
        crate::host::files::open_input(p).map_err(|e| format!("{what} {}: {e}", p.display()))
    };
    let ((snap_file, s), (mem_file, m)) =
        (open(snap, "snapshot_path")?, open(mem, "mem_file_path")?);
    if (s.dev(), s.ino()) == (m.dev(), m.ino()) {
        return Ok(());
    }
    // A copy: the same size and the same tail (the state sections, which
    // hold every page's CRC).
    let differs = || {
        format!(
            "mem_file_path {} is not the memory of snapshot {}: Hover writes one file with both names (a hard link), so give the mem_file_path snapshot/create was given with it, or a copy of that file",
            mem.display(),
            snap.display()
        )
    };
    if s.len() != m.len() {
        return Err(Refusal(differs()));
    }
    let tail = s.len().min(1 << 18);
    let read = |f: &std::fs::File, p: &Path| -> Result<Vec<u8>, Refusal> {
        let mut buf = vec![0u8; tail as usize];
        f.read_exact_at(&mut buf, s.len() - tail)
            .map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(buf)
    };
    if read(&snap_file, snap)? != read(&mem_file, mem)? {
        return Err(Refusal(differs()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_checks_name_what_hover_lacks() {
        let m = MachineConfiguration {
            smt: true,
            ..MachineConfiguration::default()
        };
        assert!(check_machine(&m).unwrap_err().0.contains("SMT"));
        let m = MachineConfiguration {
            vcpu_count: 0,
            ..MachineConfiguration::default()
        };
        assert!(check_machine(&m).unwrap_err().0.contains("vcpu_count"));
        assert!(check_machine(&MachineConfiguration::default()).is_ok());
    }

    #[test]
    fn kernels_are_told_apart_and_those_hover_cannot_boot_are_named() {
        let dir = std::env::temp_dir().join(format!("hover-fc-kernel-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mem = 128 << 20;
        let bz = dir.join("bzImage");
        let mut b = vec![0u8; 0x1000];
        b[0x1f1] = 4;
        b[0x202..0x206].copy_from_slice(b"HdrS");
        std::fs::write(&bz, &b).unwrap();
        assert!(check_kernel(&bz, mem).unwrap_err().0.contains("2.12"));
        b[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
        b[0x236] = 1;
        b[0x260..0x264].copy_from_slice(&(1u32 << 20).to_le_bytes());
        std::fs::write(&bz, &b).unwrap();
        assert!(matches!(check_kernel(&bz, mem), Ok(GuestImage::Linux(l)) if l.kernel == bz));
        let txt = dir.join("notes.txt");
        std::fs::write(&txt, b"hello").unwrap();
        assert!(check_kernel(&txt, mem)
            .unwrap_err()
            .0
            .contains("neither a Linux kernel"));
        assert!(check_kernel(&dir.join("missing"), mem).is_err());
        let builtin = dir.join("guest.elf");
        std::fs::write(&builtin, crate::boot::BUILTIN_GUEST).unwrap();
        assert!(matches!(
            check_kernel(&builtin, mem),
            Ok(GuestImage::Builtin)
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_memory_file_must_be_the_snapshot_or_its_copy() {
        let dir = std::env::temp_dir().join(format!("hover-fc-same-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b, c, d) = (dir.join("a"), dir.join("b"), dir.join("c"), dir.join("d"));
        std::fs::write(&a, vec![7u8; 5000]).unwrap();
        std::fs::hard_link(&a, &b).unwrap();
        std::fs::copy(&a, &c).unwrap();
        let mut other = vec![7u8; 5000];
        other[4999] = 8;
        std::fs::write(&d, other).unwrap();
        assert!(same_snapshot(&a, &b).is_ok());
        assert!(same_snapshot(&a, &c).is_ok());
        assert!(same_snapshot(&a, &d)
            .unwrap_err()
            .0
            .contains("not the memory"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
