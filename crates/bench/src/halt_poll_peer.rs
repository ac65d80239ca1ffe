//! `hover bench halt-poll --peer qemu`: the same `iolat` guest under QEMU
//! microvm, beside Hover's rows. Without Hover's I/O device the guest
//! drives a virtio block device (virtio-mmio, docs/ABI.md) on a file in
//! the same directory, written the same way (QD1 4 KiB writes, each
//! durable: `cache=writethrough` opens it O_DSYNC as Hover's device does),
//! with QEMU's block layer at its best here (an iothread, `aio=io_uring`).
//! QEMU leaves halt polling to KVM's module default.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::peer::{self, Boot, Machine};
use crate::BenchError;

/// One QEMU run of `iolat`.
#[derive(Clone, Debug, Serialize)]
pub struct PeerIolat {
    /// Writes per second.
    pub iops: f64,
    /// Mean latency, us.
    pub avg_us: f64,
    /// Median latency, us.
    pub p50_us: f64,
    /// 99th percentile latency, us.
    pub p99_us: f64,
}

/// The QEMU arguments for a virtio block device on `file`.
pub fn virtio_disk_args(file: &Path) -> Vec<String> {
    [
        "-global",
        "virtio-mmio.force-legacy=false",
        "-object",
        "iothread,id=io0",
        "-device",
        "virtio-blk-device,drive=d0,iothread=io0",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        "-drive".to_string(),
        format!(
            "id=d0,file={},format=raw,if=none,cache=writethrough,aio=io_uring",
            file.display()
        ),
    ])
    .collect()
}

/// Run `iolat` for `seconds` on 2 vCPUs under QEMU microvm, its disk a
/// file in `dir`.
pub fn run(
    qemu: &Path,
    image: &Path,
    dir: &Path,
    seconds: u32,
    round: u32,
) -> Result<PeerIolat, BenchError> {
    let file = dir.join(format!(
        "hover-bench-qemu-io-{}-{round}",
        std::process::id()
    ));
    let made = std::fs::File::create(&file).and_then(|f| f.set_len(1 << 20));
    if let Err(e) = made {
        return Err(BenchError::Guest(format!(
            "cannot make QEMU's disk {}: {e}",
            file.display()
        )));
    }
    let cmdline = format!("workload=iolat size=4K seconds={seconds}");
    let extra = virtio_disk_args(&file);
    let boot = Boot {
        extra: &extra,
        ..Boot::new(Machine::Microvm, image, 2, 256, &cmdline)
    };
    let r = peer::run(qemu, &boot, Duration::from_secs(seconds as u64 + 60));
    let _ = std::fs::remove_file(&file);
    let r = r.map_err(|e| BenchError::Guest(format!("QEMU iolat: {e}")))?;
    let num = |k: &str| {
        r.number(k).ok_or_else(|| {
            BenchError::Guest(format!(
                "QEMU iolat: no report {k} (exit {}): {}",
                r.exit_code,
                peer::last_lines(&r.console, 3)
            ))
        })
    };
    if r.exit_code != 0 || num("iolat.errors")? != 0.0 {
        return Err(BenchError::Guest(format!(
            "QEMU iolat failed (exit {}): {}",
            r.exit_code,
            peer::last_lines(&r.console, 3)
        )));
    }
    Ok(PeerIolat {
        iops: num("iolat.iops")?,
        avg_us: num("iolat.avg_ns")? / 1000.0,
        p50_us: num("iolat.p50_ns")? / 1000.0,
        p99_us: num("iolat.p99_ns")? / 1000.0,
    })
}
