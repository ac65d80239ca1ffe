//! The ACPI tables of a PVH boot (`hover run --boot pvh`): an RSDP, an XSDT
//! and a MADT listing one local APIC per vCPU and the IOAPIC, which is how
//! a guest booted through its PVH entry learns how many CPUs to start with
//! INIT/SIPI (the start-info page gives no count). All three lie in one
//! page ([`TABLES_GPA`]): a guest that protects the RSDP's page (the
//! built-in guest's trampoline search does) protects them all. The built-in
//! guest reads them with `hover_abi::acpi`, against which the tests here
//! check what is written.

use hover_abi::layout::IOAPIC_GPA;
use vm_memory::{Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

/// The page the tables occupy (free boot-area space).
pub const TABLES_GPA: u64 = 0xA000;
const XSDT_GPA: u64 = TABLES_GPA + 0x40;
const MADT_GPA: u64 = TABLES_GPA + 0x80;
/// Where the local APICs are (the architectural default).
const LAPIC_GPA: u32 = 0xFEE0_0000;
const OEM_ID: &[u8; 6] = b"HOVER ";
const OEM_TABLE_ID: &[u8; 8] = b"HOVERVM ";

fn checksum(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b)))
}

/// A table: the 36-byte header for `sig` and `revision`, then `body`, with
/// its length and checksum filled in.
fn table(sig: &[u8; 4], revision: u8, body: &[u8]) -> Vec<u8> {
    let mut t = Vec::with_capacity(36 + body.len());
    t.extend_from_slice(sig);
    t.extend_from_slice(&((36 + body.len()) as u32).to_le_bytes());
    t.push(revision);
    t.push(0); // checksum, below
    t.extend_from_slice(OEM_ID);
    t.extend_from_slice(OEM_TABLE_ID);
    t.extend_from_slice(&1u32.to_le_bytes()); // OEM revision
    t.extend_from_slice(b"HOVR"); // creator id
    t.extend_from_slice(&1u32.to_le_bytes()); // creator revision
    t.extend_from_slice(body);
    t[9] = checksum(&t);
    t
}

/// The MADT: the local APIC address and PC-AT compatibility, then a local
/// APIC entry (type 0) per vCPU, APIC id = index, enabled, and the IOAPIC
/// (type 1) at GSI 0.
fn madt(vcpus: u32) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&LAPIC_GPA.to_le_bytes());
    body.extend_from_slice(&1u32.to_le_bytes()); // PCAT_COMPAT: 8259s present
    for id in 0..vcpus {
        body.extend_from_slice(&[0, 8, id as u8, id as u8]);
        body.extend_from_slice(&1u32.to_le_bytes()); // enabled
    }
    body.extend_from_slice(&[1, 12, 0, 0]);
    body.extend_from_slice(&(IOAPIC_GPA as u32).to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes()); // GSI base
    table(b"APIC", 3, &body)
}

/// The RSDP (revision 2: the XSDT's address, both checksums).
fn rsdp() -> [u8; 36] {
    let mut r = [0u8; 36];
    r[..8].copy_from_slice(b"RSD PTR ");
    r[9..15].copy_from_slice(OEM_ID);
    r[15] = 2;
    r[16..20].copy_from_slice(&0u32.to_le_bytes()); // no RSDT
    r[20..24].copy_from_slice(&36u32.to_le_bytes());
    r[24..32].copy_from_slice(&XSDT_GPA.to_le_bytes());
    r[8] = checksum(&r[..20]);
    r[32] = checksum(&r);
    r
}

/// Write the tables for `vcpus` vCPUs (at most 255: one-byte APIC ids);
/// the RSDP's address, for the start-info page.
pub fn write_tables(mem: &GuestMemoryMmap, vcpus: u32) -> Result<u64, GuestMemoryError> {
    debug_assert!(vcpus <= u8::MAX as u32);
    let madt = madt(vcpus);
    debug_assert!(MADT_GPA + madt.len() as u64 <= TABLES_GPA + 0x1000);
    let xsdt = table(b"XSDT", 1, &MADT_GPA.to_le_bytes());
    mem.write_slice(&rsdp(), GuestAddress(TABLES_GPA))?;
    mem.write_slice(&xsdt, GuestAddress(XSDT_GPA))?;
    mem.write_slice(&madt, GuestAddress(MADT_GPA))?;
    Ok(TABLES_GPA)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hover_abi::acpi::{cpu_apic_ids, PhysRead};

    struct Mem<'a>(&'a GuestMemoryMmap);

    impl PhysRead for Mem<'_> {
        fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
            self.0.read_slice(buf, GuestAddress(addr)).is_ok()
        }
    }

    #[test]
    fn the_guest_reads_one_cpu_per_vcpu() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        for vcpus in [1, 2, 32] {
            let rsdp = write_tables(&mem, vcpus).unwrap();
            let mut ids = [0u32; 64];
            let n = cpu_apic_ids(&Mem(&mem), rsdp, &mut ids).unwrap();
            assert_eq!(n, vcpus as usize);
            assert!(ids[..n].iter().enumerate().all(|(i, &id)| id == i as u32));
        }
    }

    #[test]
    fn every_checksum_adds_up() {
        let sum = |b: &[u8]| b.iter().fold(0u8, |a, x| a.wrapping_add(*x));
        let r = rsdp();
        assert_eq!(sum(&r[..20]), 0);
        assert_eq!(sum(&r), 0);
        assert_eq!(sum(&madt(4)), 0);
        assert_eq!(madt(4).len(), 36 + 8 + 4 * 8 + 12);
    }
}
