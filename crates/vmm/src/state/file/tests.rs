use super::*;
use crate::config::HaltPoll;
use crate::config::MachineConfig;
use crate::vcpu::state::SpecialRegs;

fn state() -> VmState {
    let vcpu = VcpuState {
        cpuid: vec![Default::default(); 3],
        tsc_khz: 2_000_000,
        sregs: SpecialRegs::Sregs2(vec![7; 320]),
        regs: Default::default(),
        fpu: vec![1; 416],
        xsave: vec![2; 1024],
        xcrs: Default::default(),
        msrs: vec![Default::default(); 4],
        lapic: Default::default(),
        events: Default::default(),
        mp_state: Default::default(),
        debugregs: Default::default(),
    };
    VmState {
        config: SavedMachine {
            config: MachineConfig {
                vcpus: 2,
                memory: 16 << 20,
                halt_poll: HaltPoll::Fixed { window_ns: 5 },
                ..MachineConfig::default()
            },
            image_end: 2 << 20,
        },
        vcpus: vec![vcpu.clone(), vcpu],
        machine: MachineState {
            irqchip: vec![Default::default(); 3],
            clock: Default::default(),
            host_tsc: 42,
            pit: None,
        },
        devices: Default::default(),
    }
}

fn write(path: &Path) -> Vec<(u64, Vec<u8>)> {
    let pages: Vec<(u64, Vec<u8>)> = [0x1000u64, 0x2000, 0x30_0000]
        .iter()
        .map(|&g| (g, vec![(g >> 12) as u8; PAGE_SIZE as usize]))
        .collect();
    let mut w = SnapshotWriter::create(path).unwrap();
    for (g, d) in &pages {
        w.page(*g, d).unwrap();
    }
    w.hot_set(vec![0x30_0000, 0x1000]);
    w.finish(&state()).unwrap();
    pages
}

fn scratch(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("hover-snapfile-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

#[test]
fn a_written_snapshot_reads_back() {
    let p = scratch("roundtrip");
    let pages = write(&p);
    assert!(matches!(
        SnapshotWriter::create(&p),
        Err(SnapshotError::Exists(_))
    ));
    let s = Snapshot::open(&p).unwrap();
    assert_eq!(s.state.config, state().config);
    assert_eq!(s.state.vcpus.len(), 2);
    assert_eq!(s.state.machine.host_tsc, 42);
    assert_eq!(s.pages(), 3);
    assert_eq!(s.hot, vec![0x30_0000, 0x1000], "the hot set, in its order");
    let mut two = vec![0u8; 2 * PAGE_SIZE as usize];
    s.read_pages(&[0x1000, 0x2000], &mut two).unwrap();
    assert_eq!(&two[..PAGE_SIZE as usize], &pages[0].1[..]);
    assert_eq!(&two[PAGE_SIZE as usize..], &pages[1].1[..]);
    for (gpa, data) in &pages {
        let mut buf = PageBuf::new();
        assert!(s.read(*gpa, &mut buf).unwrap());
        assert_eq!(&buf.0[..], &data[..]);
    }
    let mut buf = PageBuf::new();
    assert!(
        !s.read(0x5000, &mut buf).unwrap(),
        "a page not stored is zeros"
    );
    std::fs::remove_file(&p).unwrap();
}

/// Random corruption and truncation: always an error or a snapshot, never a panic.
#[test]
fn a_hot_set_naming_pages_outside_guest_memory_is_refused() {
    for bad in [16u64 << 20, 0x1001, u64::MAX - 4095] {
        let p = scratch("hot");
        let mut w = SnapshotWriter::create(&p).unwrap();
        w.page(0x1000, &[1u8; PAGE_SIZE as usize]).unwrap();
        w.hot_set(vec![0x1000, bad]);
        w.finish(&state()).unwrap();
        let e = Snapshot::open(&p).err().expect("refused").to_string();
        assert!(
            e.contains("section HOTS") && e.contains("entry 1"),
            "{bad:#x}: {e}"
        );
        std::fs::remove_file(&p).unwrap();
    }
}

/// The `HOTS` section of a file written with `hot`: its offset, and the
/// file's bytes.
fn with_hot_set(p: &Path, hot: Vec<u64>) -> (usize, Vec<u8>) {
    let mut w = SnapshotWriter::create(p).unwrap();
    w.page(0x1000, &[1u8; PAGE_SIZE as usize]).unwrap();
    w.hot_set(hot);
    w.finish(&state()).unwrap();
    let b = std::fs::read(p).unwrap();
    let at = b
        .windows(4)
        .rposition(|t| t == b"HOTS")
        .expect("a HOTS section");
    (at, b)
}

#[test]
fn a_damaged_hot_set_is_refused_naming_the_section_and_offset() {
    let p = scratch("hot-damaged");
    let (at, mut b) = with_hot_set(&p, vec![0x1000, 0x2000, 0x3000]);
    // A byte of the payload changed: its CRC no longer matches.
    b[at + SECTION_HEADER_LEN + 1] ^= 0x40;
    std::fs::write(&p, &b).unwrap();
    let e = Snapshot::open(&p).err().expect("refused");
    assert!(
        matches!(&e, SnapshotError::Corrupt { what, offset, .. }
            if what == "section HOTS" && *offset == at as u64),
        "{e}"
    );
    // A payload that is no list of addresses, with a CRC to match.
    std::fs::remove_file(&p).unwrap();
    let (at, mut b) = with_hot_set(&p, vec![0x1000]);
    let body = at + SECTION_HEADER_LEN;
    let len = u64::from_le_bytes(b[at + 8..at + 16].try_into().unwrap()) as usize;
    b[body..body + len].fill(0xff);
    let c = crc(&b[body..body + len]);
    b[at + 16..at + 20].copy_from_slice(&c.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    let e = Snapshot::open(&p).err().expect("refused").to_string();
    assert!(
        e.contains("HOTS") && e.contains("cannot be decoded") && e.contains(&format!("{at}")),
        "{e}"
    );
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn damaged_files_never_panic() {
    let p = scratch("damaged");
    write(&p);
    let good = std::fs::read(&p).unwrap();
    let q = scratch("damaged-copy");
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut refused = 0;
    for i in 0..400 {
        let mut b = good.clone();
        if i % 4 == 0 {
            b.truncate((next() % good.len() as u64) as usize);
        } else {
            // Damage the sections and header, where decoding happens.
            for _ in 0..(1 + next() % 4) {
                let at = if next() % 4 == 0 {
                    (next() % 64) as usize
                } else {
                    good.len() - 1 - (next() % (good.len() as u64 - 4 * PAGE_SIZE)) as usize
                };
                b[at] ^= (next() % 255 + 1) as u8;
            }
        }
        std::fs::write(&q, &b).unwrap();
        if Snapshot::open(&q).is_err() {
            refused += 1;
        }
    }
    assert_eq!(refused, 400, "every damaged file is refused");
    let _ = std::fs::remove_file(&q);
    std::fs::remove_file(&p).unwrap();
}
