//! Loading the guest: the ELF image (built-in or from disk), checked before a
//! byte is copied, and the boot-info page that tells the guest its world.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use hover_abi::boot::{region_kind, BootInfo, MemRegion, MAX_MEM_REGIONS};
use hover_abi::layout::{BOOT_AREA_END, BOOT_INFO_GPA, PAGE_SIZE};
use linux_loader::loader::{elf::Elf, KernelLoader};
use vm_memory::{Bytes, GuestAddress};

use crate::config::GuestImage;
use crate::memory::{ram_ranges, GuestRam};

pub mod linux;

/// The built-in guest (crates/guest), embedded at build time.
pub static BUILTIN_GUEST: &[u8] = include_bytes!(env!("HOVER_GUEST_ELF"));

const EHDR_SIZE: usize = 64;
const PHDR_SIZE: usize = 56;
const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const PF_X: u32 = 1;
const EM_X86_64: u16 = 62;
const ET_EXEC: u16 = 2;

/// Why a guest image was refused.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The image of a restored or received VM: only in its memory.
    #[error("the guest image {0} is known only from a saved VM's memory; booting needs --guest builtin or a file")]
    NotOnDisk(String),
    /// The file could not be read.
    #[error("cannot read guest image {}: {source}", .path.display())]
    Read {
        /// The path given.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Not an ELF file we can boot.
    #[error("guest image {name} is not a bootable x86_64 ELF executable: {reason}")]
    Malformed {
        /// The image's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A segment overlaps the monitor's boot area.
    #[error("guest image {name} loads at {addr:#x}, inside the monitor's boot area; link it at {BOOT_AREA_END:#x} or above")]
    InBootArea {
        /// The image's name.
        name: String,
        /// The segment address.
        addr: u64,
    },
    /// Not enough RAM for the image.
    #[error("--memory {} is too small for guest image {name}, which needs at least {}", crate::config::size_text(*.memory), crate::config::size_text(*.needed))]
    TooLarge {
        /// The image's name.
        name: String,
        /// RAM configured.
        memory: u64,
        /// RAM needed (image end plus 1 MiB of free memory), rounded up to 1 MiB.
        needed: u64,
    },
    /// Copying into guest memory failed.
    #[error("cannot load guest image {name} into guest memory: {reason}")]
    Load {
        /// The image's name.
        name: String,
        /// linux-loader's reason.
        reason: String,
    },
}

/// An image's bytes and a name for messages.
pub struct ImageBytes {
    /// Name for messages ("built-in" or the path).
    pub name: String,
    /// The ELF file.
    pub bytes: std::borrow::Cow<'static, [u8]>,
}

/// Read the configured image.
pub fn read_image(image: &GuestImage) -> Result<ImageBytes, ImageError> {
    match image {
        GuestImage::Builtin => Ok(ImageBytes {
            name: "built-in".into(),
            bytes: BUILTIN_GUEST.into(),
        }),
        GuestImage::Path(p) => read_file(p),
        GuestImage::Loaded(name) => Err(ImageError::NotOnDisk(name.clone())),
        GuestImage::Linux(l) => Err(ImageError::NotOnDisk(l.kernel.display().to_string())),
    }
}

/// The largest guest image read (Hover's guests are small static
/// executables: the built-in one is well under a MiB); a larger file is
/// refused before it is read.
pub const MAX_GUEST_IMAGE: u64 = 64 << 20;

fn read_file(path: &Path) -> Result<ImageBytes, ImageError> {
    let bytes = crate::host::files::read_input(path, MAX_GUEST_IMAGE).map_err(|source| {
        ImageError::Read {
            path: path.into(),
            source,
        }
    })?;
    Ok(ImageBytes {
        name: path.display().to_string(),
        bytes: bytes.into(),
    })
}

/// What the ELF headers say, once checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageLayout {
    /// Entry point (guest-physical; the guest is identity-mapped).
    pub entry: u64,
    /// Lowest loaded address, page-aligned down.
    pub start: u64,
    /// One past the highest loaded byte (including bss), page-aligned up.
    pub end: u64,
    /// `(address, file size, memory size)` of each loadable segment.
    pub segments: Vec<(u64, u64, u64)>,
    /// The PVH 32-bit entry point, if the image has a Xen
    /// `PHYS32_ENTRY` note (`hover_abi::pvh`).
    pub pvh_entry: Option<u64>,
}

/// The PVH entry named by the notes in `notes` (the contents of a PT_NOTE
/// segment), if any: a note named "Xen" of type `XEN_ELFNOTE_PHYS32_ENTRY`
/// whose descriptor is a 4- or 8-byte address.
fn pvh_entry_in(notes: &[u8]) -> Option<u64> {
    let mut o = 0usize;
    while o + 12 <= notes.len() {
        let namesz = u32_at(notes, o) as usize;
        let descsz = u32_at(notes, o + 4) as usize;
        let kind = u32_at(notes, o + 8);
        let name_at = o + 12;
        let desc_at = name_at.checked_add(namesz.checked_add(3)? & !3)?;
        let next = desc_at.checked_add(descsz.checked_add(3)? & !3)?;
        if desc_at.checked_add(descsz)? > notes.len() {
            return None;
        }
        if kind == hover_abi::pvh::XEN_ELFNOTE_PHYS32_ENTRY
            && notes[name_at..name_at + namesz].starts_with(b"Xen")
        {
            return match descsz {
                4 => Some(u32_at(notes, desc_at) as u64),
                8 => Some(u64_at(notes, desc_at)),
                _ => None,
            };
        }
        o = next;
    }
    None
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

/// Check the ELF headers of `img` and describe what it loads where.
pub fn inspect(img: &ImageBytes) -> Result<ImageLayout, ImageError> {
    let bad = |reason: &str| ImageError::Malformed {
        name: img.name.clone(),
        reason: reason.into(),
    };
    let b = &img.bytes[..];
    if b.len() < EHDR_SIZE || &b[..4] != b"\x7fELF" {
        return Err(bad("no ELF header (wrong magic or file too short)"));
    }
    if b[4] != 2 || b[5] != 1 {
        return Err(bad("not a 64-bit little-endian ELF file"));
    }
    if u16_at(b, 16) != ET_EXEC {
        return Err(bad(
            "not an executable (ET_EXEC); link it with -static -no-pie",
        ));
    }
    if u16_at(b, 18) != EM_X86_64 {
        return Err(bad("built for another machine than x86_64"));
    }
    let entry = u64_at(b, 24);
    let phoff = u64_at(b, 32);
    let phentsize = u16_at(b, 54) as usize;
    let phnum = u16_at(b, 56) as usize;
    if phentsize != PHDR_SIZE {
        return Err(bad("unexpected program header size"));
    }
    let ph_end = (phoff as usize).checked_add(phnum * PHDR_SIZE);
    if phoff < EHDR_SIZE as u64 || ph_end.is_none_or(|e| e > b.len()) {
        return Err(bad("program headers lie outside the file"));
    }
    let mut segments = Vec::new();
    let mut entry_ok = false;
    let mut pvh_entry = None;
    for i in 0..phnum {
        let p = &b[phoff as usize + i * PHDR_SIZE..][..PHDR_SIZE];
        if u32_at(p, 0) == PT_NOTE && pvh_entry.is_none() {
            let (offset, filesz) = (u64_at(p, 8), u64_at(p, 32));
            if let Some(notes) = offset
                .checked_add(filesz)
                .filter(|&e| e <= b.len() as u64)
                .map(|e| &b[offset as usize..e as usize])
            {
                pvh_entry = pvh_entry_in(notes);
            }
            continue;
        }
        if u32_at(p, 0) != PT_LOAD {
            continue;
        }
        let flags = u32_at(p, 4);
        let (offset, paddr, filesz, memsz) =
            (u64_at(p, 8), u64_at(p, 24), u64_at(p, 32), u64_at(p, 40));
        if filesz > memsz {
            return Err(bad("a segment's file size exceeds its memory size"));
        }
        if offset
            .checked_add(filesz)
            .is_none_or(|e| e > b.len() as u64)
        {
            return Err(bad(
                "a segment's contents lie outside the file (truncated image?)",
            ));
        }
        if paddr.checked_add(memsz).is_none() {
            return Err(bad("a segment's address range overflows"));
        }
        if paddr < BOOT_AREA_END {
            return Err(ImageError::InBootArea {
                name: img.name.clone(),
                addr: paddr,
            });
        }
        if flags & PF_X != 0 && entry >= paddr && entry < paddr + memsz {
            entry_ok = true;
        }
        segments.push((paddr, filesz, memsz));
    }
    if segments.is_empty() {
        return Err(bad("no loadable segments"));
    }
    if !entry_ok {
        return Err(bad("the entry point is not inside an executable segment"));
    }
    let start = segments.iter().map(|s| s.0).min().expect("non-empty") & !(PAGE_SIZE - 1);
    let end = segments
        .iter()
        .map(|s| s.0 + s.2)
        .max()
        .expect("non-empty")
        .div_ceil(PAGE_SIZE)
        * PAGE_SIZE;
    Ok(ImageLayout {
        entry,
        start,
        end,
        segments,
        pvh_entry,
    })
}

/// Free RAM a guest needs beyond its image.
const MIN_FREE: u64 = 1 << 20;

/// Check that RAM of `memory` bytes holds the image and leaves room to run.
pub fn check_fits(img: &ImageBytes, layout: &ImageLayout, memory: u64) -> Result<(), ImageError> {
    let ranges = ram_ranges(memory);
    let inside = |addr: u64, len: u64| {
        ranges
            .iter()
            .any(|&(b, s)| addr >= b && addr + len <= b + s)
    };
    let fits =
        layout.segments.iter().all(|&(a, _, m)| inside(a, m)) && inside(layout.end, MIN_FREE);
    if fits {
        Ok(())
    } else {
        let needed = (layout.end + MIN_FREE).div_ceil(1 << 20) << 20;
        Err(ImageError::TooLarge {
            name: img.name.clone(),
            memory,
            needed,
        })
    }
}

/// Copy the image into guest RAM (after [`inspect`]).
///
/// Only the file-backed part of each segment is written: RAM comes fresh
/// from [`GuestRam::new`] and reads as zero, so the bss already is, and not
/// writing it keeps its pages untouched until the guest uses them (the
/// built-in guest's bss is mostly stacks for vCPUs a small VM does not have).
pub fn load(img: &ImageBytes, layout: &ImageLayout, ram: &GuestRam) -> Result<(), ImageError> {
    check_fits(img, layout, ram.size())?;
    Elf::load(
        ram.memory(),
        None,
        &mut Cursor::new(&img.bytes[..]),
        Some(GuestAddress(BOOT_AREA_END)),
    )
    .map_err(|e| ImageError::Load {
        name: img.name.clone(),
        reason: e.to_string(),
    })?;
    Ok(())
}

/// The memory map for RAM of `size` bytes holding an image at `[start, end)`.
pub fn memory_map(size: u64, image_start: u64, image_end: u64) -> Vec<MemRegion> {
    let region = |base, end: u64, kind| MemRegion {
        base,
        size: end - base,
        kind,
        reserved: 0,
    };
    let mut map = Vec::new();
    for (base, len) in ram_ranges(size) {
        let end = base + len;
        let mut cursor = base;
        if cursor < BOOT_AREA_END {
            map.push(region(
                cursor,
                BOOT_AREA_END.min(end),
                region_kind::BOOT_DATA,
            ));
            cursor = BOOT_AREA_END.min(end);
        }
        if image_start >= cursor && image_end <= end && image_start < image_end {
            if image_start > cursor {
                map.push(region(cursor, image_start, region_kind::USABLE));
            }
            map.push(region(image_start, image_end, region_kind::IMAGE));
            cursor = image_end;
        }
        if cursor < end {
            map.push(region(cursor, end, region_kind::USABLE));
        }
    }
    map
}

/// Fill in and write the boot-info page.
pub fn write_boot_info(
    ram: &GuestRam,
    vcpus: u32,
    tsc_khz: u64,
    pv_features: u32,
    cmdline: &str,
    layout: &ImageLayout,
) -> Result<BootInfo, vm_memory::GuestMemoryError> {
    let mut info = BootInfo::new();
    info.vcpu_count = vcpus;
    info.tsc_khz = tsc_khz;
    info.pv_features = pv_features;
    let map = memory_map(ram.size(), layout.start, layout.end);
    assert!(
        map.len() <= MAX_MEM_REGIONS,
        "memory map has at most 7 regions"
    );
    info.mem_regions[..map.len()].copy_from_slice(&map);
    info.mem_region_count = map.len() as u32;
    // VmConfig::validate bounds the length; the copy is bounded again here.
    let n = cmdline.len().min(info.cmdline.len());
    info.cmdline[..n].copy_from_slice(&cmdline.as_bytes()[..n]);
    info.cmdline_len = n as u32;
    // SAFETY: BootInfo is repr(C), plain old data without padding holes that
    // matter (all fields are integers), so viewing it as bytes is sound.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            &info as *const BootInfo as *const u8,
            std::mem::size_of::<BootInfo>(),
        )
    };
    ram.memory()
        .write_slice(bytes, GuestAddress(BOOT_INFO_GPA))?;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MemoryBackend;

    fn builtin() -> ImageBytes {
        read_image(&GuestImage::Builtin).unwrap()
    }

    #[test]
    fn builtin_guest_is_a_valid_image() {
        let l = inspect(&builtin()).unwrap();
        assert_eq!(l.start, BOOT_AREA_END);
        assert!(l.end > l.start);
        assert!(l.entry >= l.start && l.entry < l.end);
        let pvh = l.pvh_entry.expect("the built-in guest has a PVH entry");
        assert!(pvh >= l.start && pvh < l.end && pvh != l.entry);
    }

    fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend((name.len() as u32).to_le_bytes());
        v.extend((desc.len() as u32).to_le_bytes());
        v.extend(kind.to_le_bytes());
        v.extend(name);
        v.resize(v.len().div_ceil(4) * 4, 0);
        v.extend(desc);
        v.resize(v.len().div_ceil(4) * 4, 0);
        v
    }

    #[test]
    fn the_pvh_entry_note_is_found_among_others_and_bad_ones_are_ignored() {
        let mut notes = note(b"GNU\0", 3, &[1, 2, 3, 4, 5]);
        notes.extend(note(b"Xen\0", 18, &0x10_0038u64.to_le_bytes()));
        assert_eq!(pvh_entry_in(&notes), Some(0x10_0038));
        // A 32-bit descriptor works too.
        assert_eq!(
            pvh_entry_in(&note(b"Xen\0", 18, &0x20_0000u32.to_le_bytes())),
            Some(0x20_0000)
        );
        // Other owners, other types, odd sizes, truncation: no entry, no panic.
        assert_eq!(pvh_entry_in(&note(b"Linux\0", 18, &[0; 8])), None);
        assert_eq!(pvh_entry_in(&note(b"Xen\0", 17, &[0; 8])), None);
        assert_eq!(pvh_entry_in(&note(b"Xen\0", 18, &[0; 2])), None);
        let n = note(b"Xen\0", 18, &[0; 8]);
        for cut in 0..n.len() {
            assert_eq!(pvh_entry_in(&n[..cut]), None);
        }
        let mut huge = n.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(pvh_entry_in(&huge), None);
    }

    #[test]
    fn malformed_images_are_refused() {
        let named = |bytes: Vec<u8>| ImageBytes {
            name: "t".into(),
            bytes: bytes.into(),
        };
        let msg = |img: ImageBytes| inspect(&img).unwrap_err().to_string();
        assert!(msg(named(b"hello".to_vec())).contains("no ELF header"));
        let mut b = builtin().bytes.into_owned();
        b[18] = 0x28; // EM_ARM
        assert!(msg(named(b)).contains("another machine"));
        let mut b = builtin().bytes.into_owned();
        b.truncate(0x2000);
        assert!(msg(named(b)).contains("outside the file"));
        let mut b = builtin().bytes.into_owned();
        b[24..32].copy_from_slice(&0x10u64.to_le_bytes());
        assert!(msg(named(b)).contains("entry point"));
    }

    #[test]
    fn too_little_memory_is_refused() {
        let img = builtin();
        let l = inspect(&img).unwrap();
        let ram = GuestRam::new(2 << 20, MemoryBackend::Anonymous).unwrap();
        let e = load(&img, &l, &ram).unwrap_err().to_string();
        assert!(
            e.contains("too small") && e.contains("needs at least"),
            "{e}"
        );
    }

    /// Thousands of corrupted images (random bytes overwritten in the headers
    /// and anywhere else, truncations): each is refused or loads, none panics,
    /// and whatever loads stays inside guest RAM.
    #[test]
    fn corrupted_images_never_panic() {
        let good = builtin().bytes.into_owned();
        let ram = GuestRam::new(16 << 20, MemoryBackend::Anonymous).unwrap();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..3000 {
            let mut b = good.clone();
            for _ in 0..(next() % 8 + 1) {
                // Mostly the ELF and program headers, sometimes anywhere.
                let at = if next() % 4 == 0 {
                    next() as usize % b.len()
                } else {
                    next() as usize % 512
                };
                b[at] = next() as u8;
            }
            if next() % 8 == 0 {
                b.truncate(next() as usize % b.len());
            }
            let img = ImageBytes {
                name: "fuzz".into(),
                bytes: b.into(),
            };
            if let Ok(layout) = inspect(&img) {
                if load(&img, &layout, &ram).is_ok() {
                    assert!(layout.segments.iter().all(|&(a, _, m)| ram.contains(a, m)));
                }
            }
        }
    }

    #[test]
    fn memory_map_marks_boot_image_and_free_ram() {
        let m = memory_map(64 << 20, 0x10_0000, 0x50_0000);
        let kinds: Vec<u32> = m.iter().map(|r| r.kind).collect();
        assert_eq!(
            kinds,
            [
                region_kind::BOOT_DATA,
                region_kind::IMAGE,
                region_kind::USABLE
            ]
        );
        assert_eq!(m[2].base + m[2].size, 64 << 20);
        let m = memory_map(4 << 30, 0x10_0000, 0x50_0000);
        assert_eq!(m.last().unwrap().base, 4 << 30);
    }
}
