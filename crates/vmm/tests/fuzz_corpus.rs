//! Every input in the committed fuzz corpora (fuzz/corpus/TARGET, grown
//! by scripts/fuzz.sh; a crash found there is added to its corpus once
//! fixed) goes through its target's entry point: none may panic.

use std::path::Path;

type Entry = fn(&[u8]);

const TARGETS: [(&str, Entry); 8] = [
    ("elf", hover_vmm::fuzzing::elf),
    ("cmdline", hover_vmm::fuzzing::cmdline),
    ("api_body", hover_vmm::fuzzing::api_body),
    ("snapshot", hover_vmm::fuzzing::snapshot),
    ("migration_stream", hover_vmm::fuzzing::migration_stream),
    ("guest_records", hover_vmm::fuzzing::guest_records),
    ("virtio_block", hover_vmm::fuzzing::virtio_block),
    ("virtio_mmio", hover_vmm::fuzzing::virtio_mmio),
];

#[test]
fn every_corpus_input_is_refused_or_taken_without_a_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    for (target, entry) in TARGETS {
        let dir = root.join(target);
        let mut n = 0;
        for f in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = f.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let caught = std::panic::catch_unwind(|| entry(&data));
            assert!(caught.is_ok(), "{target}: {} panicked", path.display());
            n += 1;
        }
        assert!(n > 0, "{target}: the corpus is empty");
    }
}
