//! The CPUs another VMM describes in its ACPI tables: the RSDP, the RSDT or
//! XSDT, and the MADT's local APIC and x2APIC entries. The built-in guest
//! reads them when it boots through its PVH entry (docs/ABI.md, "PVH
//! entry"), where the start-info page gives no CPU count; here, beside the
//! contract, so the parsing is unit-tested on the host. Every checksum and
//! length is checked: a table that does not add up is not read.

/// Guest-physical memory as the reader sees it.
pub trait PhysRead {
    /// Fill `buf` from physical address `addr`; `false` if it is not memory.
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool;
}

/// Where the BIOS area keeps the RSDP when no one says where it is.
pub const RSDP_SCAN: (u64, u64) = (0xE_0000, 0x10_0000);
/// Longest table read (the MADT of 32 CPUs is well under 1 KiB).
const MAX_TABLE: usize = 16 * 1024;
/// Most RSDT/XSDT entries looked at.
const MAX_TABLES: usize = 64;

fn sum(bytes: &[u8]) -> u8 {
    bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from(u32_at(b, at)) | (u64::from(u32_at(b, at + 4)) << 32)
}

/// The address of a valid RSDP ("RSD PTR ", checksum over its first 20
/// bytes) on a 16-byte boundary in `[from, to)`.
pub fn find_rsdp(mem: &impl PhysRead, (from, to): (u64, u64)) -> Option<u64> {
    let mut at = (from + 15) & !15;
    while at + 20 <= to {
        let mut b = [0u8; 20];
        if mem.read(at, &mut b) && &b[..8] == b"RSD PTR " && sum(&b) == 0 {
            return Some(at);
        }
        at += 16;
    }
    None
}

/// Read the table at `addr` whose signature must be `sig` into `buf`;
/// its length, or why not.
fn table<'a>(
    mem: &impl PhysRead,
    addr: u64,
    sig: &[u8; 4],
    buf: &'a mut [u8; MAX_TABLE],
) -> Result<&'a [u8], &'static str> {
    let mut head = [0u8; 36];
    if !mem.read(addr, &mut head) {
        return Err("an ACPI table lies outside memory");
    }
    if &head[..4] != sig {
        return Err("an ACPI table has the wrong signature");
    }
    let len = u32_at(&head, 4) as usize;
    if !(36..=MAX_TABLE).contains(&len) {
        return Err("an ACPI table has an impossible length");
    }
    if !mem.read(addr, &mut buf[..len]) {
        return Err("an ACPI table runs outside memory");
    }
    if sum(&buf[..len]) != 0 {
        return Err("an ACPI table's checksum is wrong");
    }
    Ok(&buf[..len])
}

/// The APIC ids of the enabled CPUs the MADT reachable from the RSDP at
/// `rsdp` lists, in its order, into `ids`: how many (at most `ids.len()`).
pub fn cpu_apic_ids(
    mem: &impl PhysRead,
    rsdp: u64,
    ids: &mut [u32],
) -> Result<usize, &'static str> {
    let mut r = [0u8; 36];
    if !mem.read(rsdp, &mut r[..20]) || &r[..8] != b"RSD PTR " || sum(&r[..20]) != 0 {
        return Err("no valid RSDP there");
    }
    // Revision 2+: the XSDT (64-bit entries), when its extended checksum holds.
    let xsdt = r[15] >= 2 && mem.read(rsdp, &mut r) && sum(&r) == 0 && u64_at(&r, 24) != 0;
    let (root, sig, width) = if xsdt {
        (u64_at(&r, 24), b"XSDT", 8)
    } else {
        (u64::from(u32_at(&r, 16)), b"RSDT", 4)
    };
    let mut buf = [0u8; MAX_TABLE];
    let root = table(mem, root, sig, &mut buf)?;
    let mut entries = [0u64; MAX_TABLES];
    let n = ((root.len() - 36) / width).min(MAX_TABLES);
    for (i, e) in entries.iter_mut().enumerate().take(n) {
        let at = 36 + i * width;
        *e = if width == 8 {
            u64_at(root, at)
        } else {
            u64::from(u32_at(root, at))
        };
    }
    for &addr in &entries[..n] {
        let mut sig = [0u8; 4];
        if !mem.read(addr, &mut sig) || &sig != b"APIC" {
            continue;
        }
        let madt = table(mem, addr, b"APIC", &mut buf)?;
        return Ok(madt_ids(madt, ids));
    }
    Err("no MADT (APIC table) in the RSDT/XSDT")
}

/// Enabled (or online-capable) CPUs of a checked MADT: type 0 (local APIC)
/// and type 9 (x2APIC) entries.
fn madt_ids(madt: &[u8], ids: &mut [u32]) -> usize {
    let mut count = 0;
    let mut at = 44;
    while at + 2 <= madt.len() && count < ids.len() {
        let (kind, len) = (madt[at], madt[at + 1] as usize);
        if len < 2 || at + len > madt.len() {
            break;
        }
        let e = &madt[at..at + len];
        let usable = |flags: u32| flags & 0b11 != 0;
        match kind {
            0 if len >= 8 && usable(u32_at(e, 4)) => {
                ids[count] = u32::from(e[3]);
                count += 1;
            }
            9 if len >= 16 && usable(u32_at(e, 8)) => {
                ids[count] = u32_at(e, 4);
                count += 1;
            }
            _ => {}
        }
        at += len;
    }
    count
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;
    use std::vec::Vec;

    /// 1 MiB of memory from address 0.
    struct Mem(Vec<u8>);

    impl PhysRead for Mem {
        fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
            let a = addr as usize;
            match self.0.get(a..a + buf.len()) {
                Some(s) => {
                    buf.copy_from_slice(s);
                    true
                }
                None => false,
            }
        }
    }

    impl Mem {
        fn put(&mut self, at: usize, b: &[u8]) {
            self.0[at..at + b.len()].copy_from_slice(b);
        }
    }

    fn fix_sum(b: &mut [u8], at: usize) {
        b[at] = 0;
        b[at] = 0u8.wrapping_sub(sum(b));
    }

    fn sdt(sig: &[u8; 4], body: &[u8]) -> Vec<u8> {
        let mut t = vec![0u8; 36];
        t[..4].copy_from_slice(sig);
        t.extend_from_slice(body);
        let len = t.len() as u32;
        t[4..8].copy_from_slice(&len.to_le_bytes());
        fix_sum(&mut t, 9);
        t
    }

    fn madt(entries: &[&[u8]]) -> Vec<u8> {
        let mut body = vec![0u8; 8]; // local APIC address, flags
        for e in entries {
            body.extend_from_slice(e);
        }
        sdt(b"APIC", &body)
    }

    fn lapic(id: u8, flags: u32) -> Vec<u8> {
        let mut e = vec![0, 8, id, id];
        e.extend_from_slice(&flags.to_le_bytes());
        e
    }

    fn x2apic(id: u32, flags: u32) -> Vec<u8> {
        let mut e = vec![9, 16, 0, 0];
        e.extend_from_slice(&id.to_le_bytes());
        e.extend_from_slice(&flags.to_le_bytes());
        e.extend_from_slice(&id.to_le_bytes());
        e
    }

    /// A revision-0 RSDP in the BIOS area -> RSDT -> (FACP, MADT).
    fn machine(madt: &[u8]) -> Mem {
        let mut m = Mem(vec![0u8; 0x10_0000]);
        m.put(0x2000, &sdt(b"FACP", &[0; 8]));
        m.put(0x3000, madt);
        let mut body = Vec::new();
        body.extend_from_slice(&0x2000u32.to_le_bytes());
        body.extend_from_slice(&0x3000u32.to_le_bytes());
        m.put(0x1000, &sdt(b"RSDT", &body));
        let mut rsdp = vec![0u8; 20];
        rsdp[..8].copy_from_slice(b"RSD PTR ");
        rsdp[16..20].copy_from_slice(&0x1000u32.to_le_bytes());
        fix_sum(&mut rsdp, 8);
        m.put(0xF_5A30, &rsdp);
        m
    }

    #[test]
    fn the_rsdp_is_found_in_the_bios_area_and_the_cpus_in_the_madt() {
        let m = machine(&madt(&[
            &lapic(0, 1),
            &lapic(1, 1),
            &lapic(7, 0),
            &x2apic(2, 1),
        ]));
        let rsdp = find_rsdp(&m, RSDP_SCAN).unwrap();
        assert_eq!(rsdp, 0xF_5A30);
        let mut ids = [0u32; 8];
        // The disabled CPU (id 7) is left out.
        assert_eq!(cpu_apic_ids(&m, rsdp, &mut ids), Ok(3));
        assert_eq!(&ids[..3], &[0, 1, 2]);
        // No more than the caller has room for.
        let mut two = [0u32; 2];
        assert_eq!(cpu_apic_ids(&m, rsdp, &mut two), Ok(2));
    }

    #[test]
    fn a_table_that_does_not_add_up_is_not_read() {
        let mut m = machine(&madt(&[&lapic(0, 1), &lapic(1, 1)]));
        let mut ids = [0u32; 8];
        m.0[0x3000 + 44] ^= 1; // MADT checksum now wrong
        assert_eq!(
            cpu_apic_ids(&m, 0xF_5A30, &mut ids),
            Err("an ACPI table's checksum is wrong")
        );
        let mut m = machine(&madt(&[&lapic(0, 1)]));
        m.put(0x3004, &0xFFFF_FFFFu32.to_le_bytes()); // length
        assert_eq!(
            cpu_apic_ids(&m, 0xF_5A30, &mut ids),
            Err("an ACPI table has an impossible length")
        );
        let mut m = machine(&madt(&[&lapic(0, 1)]));
        m.0[0xF_5A30 + 3] = b'x';
        assert_eq!(find_rsdp(&m, RSDP_SCAN), None);
        assert_eq!(
            cpu_apic_ids(&m, 0xF_5A30, &mut ids),
            Err("no valid RSDP there")
        );
    }

    #[test]
    fn a_madt_entry_running_past_the_table_ends_the_list() {
        let mut bad = lapic(1, 1);
        bad[1] = 200;
        let m = machine(&madt(&[&lapic(0, 1), &bad, &lapic(2, 1)]));
        let mut ids = [0u32; 8];
        assert_eq!(cpu_apic_ids(&m, 0xF_5A30, &mut ids), Ok(1));
    }

    #[test]
    fn without_a_madt_it_says_so() {
        let mut m = machine(&madt(&[&lapic(0, 1)]));
        m.put(0x3000, b"NOPE");
        let mut ids = [0u32; 8];
        assert_eq!(
            cpu_apic_ids(&m, 0xF_5A30, &mut ids),
            Err("no MADT (APIC table) in the RSDT/XSDT")
        );
    }
}
