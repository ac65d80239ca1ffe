//! Booting a Linux kernel (`hover run --kernel`): a bzImage or an
//! uncompressed x86-64 ELF `vmlinux` loaded by linux-loader at 1 MiB, the
//! zero page (`struct boot_params`, Documentation/arch/x86/boot.rst) with an
//! e820 map of guest RAM, the command line and the initrd placed as the
//! boot protocol says, and the 64-bit entry the boot vCPU starts at. The
//! other vCPUs wait for the kernel's INIT/SIPI; the ACPI tables
//! (`arch::x86_64::acpi::write_linux_tables`) tell it how many there are.

use std::path::{Path, PathBuf};

use hover_abi::layout::BOOT_AREA_END;
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use linux_loader::loader::{bzimage::BzImage, elf::Elf, KernelLoader};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::host::files::read_input;
use crate::memory::ram_ranges;

/// Where the zero page goes (below the boot area's page tables).
pub const ZERO_PAGE_GPA: u64 = 0x7000;
/// Where the command line goes (free boot-area space below the EBDA).
pub const CMDLINE_GPA: u64 = 0x8_0000;
/// The most command line the kernel takes (x86's `COMMAND_LINE_SIZE`).
pub const CMDLINE_MAX: usize = 2048;
/// Where the kernel is loaded: 1 MiB, the protocol's `code32_start`.
pub const KERNEL_GPA: u64 = BOOT_AREA_END;
/// The command line a Linux guest gets by default: the console on COM1,
/// reboot through the keyboard controller, no waiting after a panic.
pub const DEFAULT_CMDLINE: &str = "console=ttyS0 reboot=k panic=-1";

/// The command line the kernel gets: `cmdline`, and when the guest may
/// poll before it halts (`guest_poll_max_ns` above 0), the poll limit
/// handed to Linux's haltpoll governor as its `guest_halt_poll_ns`, as the
/// built-in guest's `idle=haltpoll` reads it from its area (unless the
/// line sets it already: the user's word stands).
pub fn effective_cmdline(cmdline: &str, guest_poll_max_ns: u64) -> String {
    let param = "haltpoll.guest_halt_poll_ns=";
    if guest_poll_max_ns == 0 || cmdline.split_whitespace().any(|a| a.starts_with(param)) {
        return cmdline.to_string();
    }
    let sep = if cmdline.is_empty() { "" } else { " " };
    format!("{cmdline}{sep}{param}{guest_poll_max_ns}")
}
/// Low memory usable below the EBDA (the rest up to 1 MiB is reserved:
/// the BIOS area, where the ACPI tables are).
const EBDA_START: u64 = 0x9_fc00;

const E820_RAM: u32 = 1;
const E820_RESERVED: u32 = 2;
/// "HdrS": a boot protocol header.
const HDRS: u32 = 0x5372_6448;
/// The oldest boot protocol accepted: 2.12 (64-bit entry, xloadflags).
const MIN_PROTOCOL: u16 = 0x020c;
/// xloadflags: the kernel has a 64-bit entry at `code32_start + 0x200`.
const XLF_KERNEL_64: u16 = 1;
/// loadflags: loaded high (at 1 MiB).
const LOADED_HIGH: u8 = 1;
/// type_of_loader: "undefined" (no registered id).
const LOADER_UNDEFINED: u8 = 0xff;
/// The 64-bit entry's offset from where a bzImage's kernel is loaded.
const ENTRY_64_OFFSET: u64 = 0x200;
/// Where a bzImage's setup header starts.
const HEADER_OFFSET: usize = 0x1f1;

pub use crate::config::LinuxBoot;

/// Why a kernel or initrd was refused.
#[derive(Debug, thiserror::Error)]
pub enum LinuxError {
    /// The file could not be read (missing, unreadable, not a regular file, too large).
    #[error("{what} {}: {source}", .path.display())]
    Read {
        /// `--kernel` or `--initrd`.
        what: &'static str,
        /// The path given.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not a kernel Hover boots.
    #[error("--kernel {}: {reason}", .path.display())]
    Kernel {
        /// The path given.
        path: PathBuf,
        /// What is wrong, and what is accepted.
        reason: String,
    },
    /// The kernel and initrd do not fit in guest memory.
    #[error("{0}")]
    TooLarge(String),
    /// The command line is too long for the kernel.
    #[error("--cmdline is {len} bytes; this kernel takes at most {max}")]
    Cmdline {
        /// Its length.
        len: usize,
        /// The kernel's limit.
        max: usize,
    },
}

/// Where the boot vCPU starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinuxEntry {
    /// The kernel's 64-bit entry point.
    pub rip: u64,
    /// The zero page (RSI at entry).
    pub zero_page: u64,
    /// Where the loaded kernel ends.
    pub kernel_end: u64,
}

/// The two formats accepted, told apart by their first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    BzImage,
    Elf,
}

fn format(path: &Path, bytes: &[u8]) -> Result<Format, LinuxError> {
    let refuse = |reason: &str| LinuxError::Kernel {
        path: path.into(),
        reason: reason.into(),
    };
    if bytes.starts_with(b"\x7fELF") {
        // ELFCLASS64, little-endian, EM_X86_64.
        if bytes.len() < 64 || bytes[4] != 2 || bytes[5] != 1 || u16_at(bytes, 18) != 62 {
            return Err(refuse(
                "an ELF file, but not an x86-64 one: give a 64-bit x86 vmlinux or a bzImage",
            ));
        }
        return Ok(Format::Elf);
    }
    if bytes.len() >= 0x206 && u32_at(bytes, 0x202) == HDRS {
        return Ok(Format::BzImage);
    }
    Err(refuse(
        "neither a bzImage (no \"HdrS\" boot header at 0x202) nor an x86-64 ELF vmlinux: give the kernel's bzImage (arch/x86/boot/bzImage, /boot/vmlinuz-*) or its vmlinux",
    ))
}

/// Whether `head` (a file's first 4 KiB) starts a Linux kernel: a bzImage,
/// or an x86-64 ELF with a segment linked in the kernel's half of the
/// address space (a vmlinux; Hover's own guests are linked low).
pub fn is_linux_kernel(head: &[u8]) -> bool {
    if head.len() >= 0x206 && u32_at(head, 0x202) == HDRS {
        return true;
    }
    let elf64_x86 = head.len() >= 64
        && head.starts_with(b"\x7fELF")
        && head[4] == 2
        && head[5] == 1
        && u16_at(head, 18) == 62;
    if !elf64_x86 {
        return false;
    }
    let u64_at = |o: usize| {
        head.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    let (Some(phoff), phentsize, phnum) = (u64_at(32), u16_at(head, 54), u16_at(head, 56)) else {
        return false;
    };
    (0..usize::from(phnum)).any(|i| {
        let at = usize::try_from(phoff)
            .ok()
            .and_then(|o| o.checked_add(i * usize::from(phentsize)));
        // PT_LOAD, and p_vaddr's top bit set (a header past the head: no).
        at.and_then(|a| Some((a, a.checked_add(16)?)))
            .is_some_and(|(a, v)| {
                head.get(a..a.saturating_add(4)) == Some(&1u32.to_le_bytes()[..])
                    && u64_at(v).is_some_and(|v| v >> 63 == 1)
            })
    })
}

/// Check what a kernel's first bytes (`head`, at least 4 KiB or the whole
/// file) say before it is read whole: its format, and a bzImage's boot
/// protocol, entry and size against `memory` bytes of guest RAM.
pub fn check_head(path: &Path, head: &[u8], memory: u64) -> Result<(), LinuxError> {
    if format(path, head)? == Format::BzImage {
        check_header(path, &header(path, head)?, ram_low(memory))?;
    }
    Ok(())
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// A bzImage's setup header, read from its bytes.
fn header(path: &Path, kernel: &[u8]) -> Result<setup_header, LinuxError> {
    let n = std::mem::size_of::<setup_header>();
    let Some(bytes) = kernel.get(HEADER_OFFSET..HEADER_OFFSET + n) else {
        return Err(LinuxError::Kernel {
            path: path.into(),
            reason: "truncated: shorter than its boot header".into(),
        });
    };
    let mut h = setup_header::default();
    // SAFETY: setup_header is plain old data (every bit pattern valid) and
    // `bytes` holds exactly its size.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), &mut h as *mut setup_header as *mut u8, n)
    };
    Ok(h)
}

/// Check a bzImage's setup header: a protocol of 2.12 or later with a
/// 64-bit entry, and room for the kernel to unpack itself in `ram_low`
/// (guest RAM below the MMIO hole).
fn check_header(path: &Path, h: &setup_header, ram_low: u64) -> Result<(), LinuxError> {
    let refuse = |reason: String| LinuxError::Kernel {
        path: path.into(),
        reason,
    };
    let version = h.version;
    if version < MIN_PROTOCOL {
        return Err(refuse(format!(
            "boot protocol {}.{:02} is too old: Hover boots 2.12 or later (Linux 3.8+)",
            version >> 8,
            version & 0xff
        )));
    }
    let xloadflags = h.xloadflags;
    if xloadflags & XLF_KERNEL_64 == 0 {
        return Err(refuse(
            "a 32-bit-only kernel (no 64-bit entry in its xloadflags): give an x86-64 kernel"
                .into(),
        ));
    }
    let init_size = u64::from(h.init_size);
    if KERNEL_GPA + init_size > ram_low {
        return Err(LinuxError::TooLarge(format!(
            "--memory is too small for this kernel: it unpacks into {} from 1 MiB",
            crate::config::size_text(init_size)
        )));
    }
    Ok(())
}

/// The e820 map of `memory` bytes of guest RAM: low memory below the EBDA,
/// the BIOS area reserved (the ACPI tables are there), then RAM from 1 MiB
/// around the MMIO hole.
pub fn e820(memory: u64) -> Vec<boot_e820_entry> {
    let mut map = vec![
        boot_e820_entry {
            addr: 0,
            size: EBDA_START,
            r#type: E820_RAM,
        },
        boot_e820_entry {
            addr: EBDA_START,
            size: BOOT_AREA_END - EBDA_START,
            r#type: E820_RESERVED,
        },
    ];
    for (start, len) in ram_ranges(memory) {
        let end = start + len;
        let start = start.max(BOOT_AREA_END);
        if end > start {
            map.push(boot_e820_entry {
                addr: start,
                size: end - start,
                r#type: E820_RAM,
            });
        }
    }
    map
}

/// RAM below the MMIO hole: where the kernel, initrd and command line must be.
fn ram_low(memory: u64) -> u64 {
    // The first range starts at 0: its length is its end.
    ram_ranges(memory).first().map_or(0, |&(_, len)| len)
}

fn read(what: &'static str, path: &Path, max: u64) -> Result<Vec<u8>, LinuxError> {
    read_input(path, max).map_err(|source| LinuxError::Read {
        what,
        path: path.into(),
        source,
    })
}

/// A kernel and initrd read and checked, ready to load: everything a
/// boot can refuse is refused here, before a VM exists.
pub struct LinuxImage {
    path: PathBuf,
    kernel: Vec<u8>,
    initrd: Option<Vec<u8>>,
    format: Format,
    header: setup_header,
    memory: u64,
}

impl LinuxImage {
    /// Read `boot` for a guest of `memory` bytes and check it, and
    /// `cmdline` against it. The files are read once, each bounded by
    /// guest memory, through the descriptor checked.
    pub fn read(boot: &LinuxBoot, memory: u64, cmdline: &str) -> Result<LinuxImage, LinuxError> {
        let low = ram_low(memory);
        let kernel = read("--kernel", &boot.kernel, low)?;
        let initrd = match &boot.initrd {
            Some(p) => Some(read("--initrd", p, low)?),
            None => None,
        };
        let format = format(&boot.kernel, &kernel)?;
        let header = match format {
            Format::BzImage => {
                let h = header(&boot.kernel, &kernel)?;
                check_header(&boot.kernel, &h, low)?;
                h
            }
            // A vmlinux has no setup header: the fields the kernel reads.
            Format::Elf => setup_header {
                boot_flag: 0xaa55,
                header: HDRS,
                version: MIN_PROTOCOL,
                kernel_alignment: 0x100_0000,
                cmdline_size: CMDLINE_MAX as u32,
                initrd_addr_max: 0x7fff_ffff,
                ..Default::default()
            },
        };
        let max_cmdline = match header.cmdline_size {
            0 => 255,
            n => (n as usize).min(CMDLINE_MAX),
        };
        if cmdline.len() >= max_cmdline {
            return Err(LinuxError::Cmdline {
                len: cmdline.len(),
                max: max_cmdline - 1,
            });
        }
        if let Some(rd) = &initrd {
            let (kernel_size, at) = (kernel.len() as u64, u64::from(header.initrd_addr_max));
            if place_initrd(rd.len() as u64, KERNEL_GPA + kernel_size, low, at).is_none() {
                return Err(too_small_for_initrd(rd.len()));
            }
        }
        Ok(LinuxImage {
            path: boot.kernel.clone(),
            kernel,
            initrd,
            format,
            header,
            memory,
        })
    }

    /// Load it into `mem` with `cmdline` (checked by [`LinuxImage::read`]),
    /// telling the kernel the ACPI tables are at `rsdp`.
    pub fn load(
        &self,
        mem: &GuestMemoryMmap,
        cmdline: &str,
        rsdp: u64,
    ) -> Result<LinuxEntry, LinuxError> {
        let low = ram_low(self.memory);
        let kernel_err = |e: linux_loader::loader::Error| LinuxError::Kernel {
            path: self.path.clone(),
            reason: format!("cannot load it: {e}"),
        };
        let mut cursor = std::io::Cursor::new(&self.kernel[..]);
        let at = Some(GuestAddress(KERNEL_GPA));
        let (rip, kernel_end) = match self.format {
            Format::BzImage => {
                let r = BzImage::load(mem, at, &mut cursor, at).map_err(kernel_err)?;
                (r.kernel_load.0 + ENTRY_64_OFFSET, r.kernel_end)
            }
            Format::Elf => {
                let r = Elf::load(mem, None, &mut cursor, at).map_err(kernel_err)?;
                (r.kernel_load.0, r.kernel_end)
            }
        };
        let mut params = boot_params {
            hdr: self.header,
            ..Default::default()
        };
        params.hdr.type_of_loader = LOADER_UNDEFINED;
        params.hdr.loadflags |= LOADED_HIGH;
        params.hdr.code32_start = KERNEL_GPA as u32;
        params.hdr.cmd_line_ptr = CMDLINE_GPA as u32;
        params.hdr.cmdline_size = cmdline.len() as u32;
        params.acpi_rsdp_addr = rsdp;
        let write = |e: vm_memory::GuestMemoryError| LinuxError::TooLarge(e.to_string());
        if let Some(initrd) = &self.initrd {
            let addr_max = u64::from(params.hdr.initrd_addr_max);
            let (at, len) = place_initrd(initrd.len() as u64, kernel_end, low, addr_max)
                .ok_or_else(|| too_small_for_initrd(initrd.len()))?;
            mem.write_slice(initrd, GuestAddress(at)).map_err(write)?;
            params.hdr.ramdisk_image = at as u32;
            params.hdr.ramdisk_size = len as u32;
        }
        let map = e820(self.memory);
        params.e820_entries = map.len() as u8;
        params.e820_table[..map.len()].copy_from_slice(&map);
        let mut line = cmdline.as_bytes().to_vec();
        line.push(0);
        mem.write_slice(&line, GuestAddress(CMDLINE_GPA))
            .map_err(write)?;
        mem.write_obj(params, GuestAddress(ZERO_PAGE_GPA))
            .map_err(write)?;
        Ok(LinuxEntry {
            rip,
            zero_page: ZERO_PAGE_GPA,
            kernel_end,
        })
    }
}

fn too_small_for_initrd(len: usize) -> LinuxError {
    LinuxError::TooLarge(format!(
        "--memory is too small for the kernel and its {} initrd",
        crate::config::size_text(len as u64)
    ))
}

/// Where an initrd of `len` bytes goes: as high as the protocol allows
/// (below `addr_max` and the end of low RAM), page-aligned, above the
/// kernel's end. None: it does not fit.
fn place_initrd(len: u64, kernel_end: u64, ram_low: u64, addr_max: u64) -> Option<(u64, u64)> {
    let top = ram_low.min(addr_max.saturating_add(1));
    let at = top.checked_sub(len)? & !0xfff;
    (at >= kernel_end.next_multiple_of(0x1000)).then_some((at, len))
}

#[cfg(test)]
mod tests;
