//! Booting Linux, tested on made-up kernels: formats told apart, boot
//! headers refused with the reason, the zero page, e820 map, command line
//! and initrd placed where the boot protocol says.

use super::*;

/// An x86-64 ELF header with one PT_LOAD segment at `vaddr`.
fn elf_with_load_at(vaddr: u64) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = 2;
    b[5] = 1;
    b[16..18].copy_from_slice(&2u16.to_le_bytes());
    b[18..20].copy_from_slice(&62u16.to_le_bytes());
    b[32..40].copy_from_slice(&64u64.to_le_bytes());
    b[54..56].copy_from_slice(&56u16.to_le_bytes());
    b[56..58].copy_from_slice(&1u16.to_le_bytes());
    b[64..68].copy_from_slice(&1u32.to_le_bytes());
    b[80..88].copy_from_slice(&vaddr.to_le_bytes());
    b
}

#[test]
fn linux_kernels_are_told_from_hovers_own_guests() {
    assert!(is_linux_kernel(&bzimage(0x020f, 1, 1 << 20, 4096)));
    assert!(is_linux_kernel(&elf_with_load_at(0xffff_ffff_8100_0000)));
    assert!(!is_linux_kernel(&elf_with_load_at(0x40_0000)));
    assert!(!is_linux_kernel(&crate::boot::BUILTIN_GUEST[..4096]));
    assert!(!is_linux_kernel(b"\x7fELF"));
    assert!(!is_linux_kernel(&[0u8; 4096]));
    // Program headers said to lie at the end of the address space.
    let mut far = elf_with_load_at(0xffff_ffff_8100_0000);
    far[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(!is_linux_kernel(&far));
}

#[test]
fn a_kernels_head_is_checked_before_it_is_read_whole() {
    let p = Path::new("k");
    check_head(p, &bzimage(0x020f, 1, 1 << 20, 0), 256 << 20).unwrap();
    let old = check_head(p, &bzimage(0x0206, 1, 1 << 20, 0), 256 << 20).unwrap_err();
    assert!(old.to_string().contains("2.12"), "{old}");
    let big = check_head(p, &bzimage(0x020f, 1, 64 << 20, 0), 32 << 20).unwrap_err();
    assert!(big.to_string().contains("too small"), "{big}");
}

/// Read, check and load `boot` into `mem` (`memory` bytes of guest RAM)
/// with `cmdline`: [`LinuxImage::read`], then [`LinuxImage::load`].
fn load(
    mem: &GuestMemoryMmap,
    memory: u64,
    boot: &LinuxBoot,
    cmdline: &str,
    rsdp: u64,
) -> Result<LinuxEntry, LinuxError> {
    LinuxImage::read(boot, memory, cmdline)?.load(mem, cmdline, rsdp)
}

/// A minimal bzImage: a boot sector, 4 sectors of setup with a header
/// of `version` and `xloadflags`, then `payload` bytes of kernel.
fn bzimage(version: u16, xloadflags: u16, init_size: u32, payload: usize) -> Vec<u8> {
    let setup_sects = 4u8;
    let mut b = vec![0u8; (setup_sects as usize + 1) * 512 + payload];
    b[0x1f1] = setup_sects;
    b[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
    b[0x202..0x206].copy_from_slice(&HDRS.to_le_bytes());
    b[0x206..0x208].copy_from_slice(&version.to_le_bytes());
    b[0x211] = LOADED_HIGH;
    b[0x214..0x218].copy_from_slice(&(KERNEL_GPA as u32).to_le_bytes());
    b[0x22c..0x230].copy_from_slice(&0x7fff_ffffu32.to_le_bytes()); // initrd_addr_max
    b[0x236..0x238].copy_from_slice(&xloadflags.to_le_bytes());
    b[0x238..0x23c].copy_from_slice(&2048u32.to_le_bytes()); // cmdline_size
    b[0x260..0x264].copy_from_slice(&init_size.to_le_bytes());
    b
}

fn scratch(name: &str, bytes: &[u8]) -> PathBuf {
    let p = std::env::temp_dir().join(format!("hover-linux-{name}-{}", std::process::id()));
    std::fs::write(&p, bytes).unwrap();
    p
}

fn mem(size: u64) -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size as usize)]).unwrap()
}

#[test]
fn a_bzimage_gets_its_zero_page_cmdline_initrd_and_entry() {
    let k = scratch("bz", &bzimage(0x020f, XLF_KERNEL_64, 4 << 20, 8192));
    let i = scratch("initrd", &[7u8; 10000]);
    let m = mem(64 << 20);
    let boot = LinuxBoot {
        kernel: k.clone(),
        initrd: Some(i.clone()),
    };
    let e = load(&m, 64 << 20, &boot, "console=ttyS0", 0xe0000).unwrap();
    assert_eq!(e.rip, KERNEL_GPA + 0x200);
    assert_eq!(e.zero_page, ZERO_PAGE_GPA);
    let p: boot_params = m.read_obj(GuestAddress(ZERO_PAGE_GPA)).unwrap();
    let h = p.hdr;
    assert_eq!({ h.type_of_loader }, LOADER_UNDEFINED);
    assert_eq!({ h.cmd_line_ptr } as u64, CMDLINE_GPA);
    assert_eq!({ p.acpi_rsdp_addr }, 0xe0000);
    let (at, len) = ({ h.ramdisk_image } as u64, { h.ramdisk_size } as u64);
    assert_eq!(len, 10000);
    assert_eq!(at % 4096, 0);
    assert!(at + len <= 64 << 20 && at >= KERNEL_GPA + 8192);
    let mut back = vec![0u8; 10000];
    m.read_slice(&mut back, GuestAddress(at)).unwrap();
    assert!(back.iter().all(|&b| b == 7));
    let mut line = [0u8; 14];
    m.read_slice(&mut line, GuestAddress(CMDLINE_GPA)).unwrap();
    assert_eq!(&line, b"console=ttyS0\0");
    assert_eq!({ p.e820_entries }, 3);
    std::fs::remove_file(k).unwrap();
    std::fs::remove_file(i).unwrap();
}

#[test]
fn the_e820_map_reserves_the_bios_area_and_skips_the_mmio_hole() {
    let map = e820(256 << 20);
    let e = |i: usize| (map[i].addr, map[i].size, map[i].r#type);
    assert_eq!(e(0), (0, EBDA_START, E820_RAM));
    assert_eq!(
        e(1),
        (EBDA_START, BOOT_AREA_END - EBDA_START, E820_RESERVED)
    );
    assert_eq!(e(2), (BOOT_AREA_END, (256 << 20) - BOOT_AREA_END, E820_RAM));
    let big = e820(4 << 30);
    assert_eq!(big.len(), 4, "RAM above 4 GiB is a range of its own");
    assert_eq!({ big[3].addr }, 1 << 32);
}

#[test]
fn kernels_that_cannot_boot_are_refused_and_nothing_is_written() {
    let m = mem(64 << 20);
    let mut elf32 = vec![0u8; 128];
    elf32[..4].copy_from_slice(b"\x7fELF");
    elf32[4] = 1;
    let cases: [(&str, Vec<u8>, &str); 5] = [
        (
            "text",
            b"not a kernel at all, just some text".repeat(40),
            "neither a bzImage",
        ),
        (
            "old",
            bzimage(0x0206, XLF_KERNEL_64, 1 << 20, 4096),
            "2.12 or later",
        ),
        ("32bit", bzimage(0x020f, 0, 1 << 20, 4096), "32-bit-only"),
        (
            "huge",
            bzimage(0x020f, XLF_KERNEL_64, 100 << 20, 4096),
            "too small",
        ),
        ("elf32", elf32, "not an x86-64"),
    ];
    for (name, bytes, want) in cases {
        let k = scratch(name, &bytes);
        let boot = LinuxBoot {
            kernel: k.clone(),
            initrd: None,
        };
        let e = load(&m, 64 << 20, &boot, "", 0).unwrap_err().to_string();
        assert!(e.contains(want), "{name}: {e}");
        let p: boot_params = m.read_obj(GuestAddress(ZERO_PAGE_GPA)).unwrap();
        assert_eq!({ p.hdr.header }, 0, "{name}: the zero page was written");
        std::fs::remove_file(k).unwrap();
    }
}

#[test]
fn a_truncated_bzimage_a_missing_file_and_a_directory_are_refused() {
    let m = mem(64 << 20);
    let full = bzimage(0x020f, XLF_KERNEL_64, 1 << 20, 4096);
    let k = scratch("trunc", &full[..0x210]);
    for (path, want) in [
        (k.clone(), "truncated"),
        (PathBuf::from("/nonexistent/vmlinuz"), "No such file"),
        (PathBuf::from("/tmp"), "not a regular file"),
    ] {
        let boot = LinuxBoot {
            kernel: path.clone(),
            initrd: None,
        };
        let e = load(&m, 64 << 20, &boot, "", 0).unwrap_err().to_string();
        assert!(e.contains(want), "{}: {e}", path.display());
    }
    std::fs::remove_file(k).unwrap();
}

#[test]
fn guest_polling_hands_the_limit_to_linuxs_haltpoll_governor() {
    assert_eq!(effective_cmdline("console=ttyS0", 0), "console=ttyS0");
    assert_eq!(
        effective_cmdline("console=ttyS0", 100_000),
        "console=ttyS0 haltpoll.guest_halt_poll_ns=100000"
    );
    assert_eq!(effective_cmdline("", 5), "haltpoll.guest_halt_poll_ns=5");
    let own = "console=ttyS0 haltpoll.guest_halt_poll_ns=7";
    assert_eq!(
        effective_cmdline(own, 100_000),
        own,
        "the user's own stands"
    );
}

#[test]
fn an_initrd_that_does_not_fit_and_a_long_cmdline_are_refused() {
    let m = mem(16 << 20);
    let k = scratch("fit", &bzimage(0x020f, XLF_KERNEL_64, 4 << 20, 4096));
    let i = scratch("bigrd", &vec![1u8; 15 << 20]);
    let boot = LinuxBoot {
        kernel: k.clone(),
        initrd: Some(i.clone()),
    };
    let e = load(&m, 16 << 20, &boot, "", 0).unwrap_err().to_string();
    assert!(e.contains("too small for the kernel and its"), "{e}");
    let boot = LinuxBoot {
        kernel: k.clone(),
        initrd: None,
    };
    let e = load(&m, 16 << 20, &boot, &"x".repeat(3000), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("at most 2047"), "{e}");
    std::fs::remove_file(k).unwrap();
    std::fs::remove_file(i).unwrap();
}

#[test]
fn an_initrd_goes_high_below_its_limit() {
    assert_eq!(
        place_initrd(8192, 0x20_0000, 0x100_0000, u64::MAX),
        Some((0xff_e000, 8192))
    );
    assert_eq!(
        place_initrd(8192, 0x20_0000, 0x100_0000, 0x7f_ffff),
        Some((0x7f_e000, 8192))
    );
    assert_eq!(
        place_initrd(0x100_0000, 0x20_0000, 0x100_0000, u64::MAX),
        None
    );
}
