//! `hover bench migrate`, seed 3's own setting: a sender in a separate
//! process that must map guest memory. Whole migrations with each mapping
//! mode beside the VMM's own sending thread, and the mapping
//! micro-benchmark (a sender process reads a memfd guest by each mode).

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use super::MigrateBench;
use crate::hover_process::guest;
use crate::migration_run::migrate_once;
use crate::stats::{summarize, Summary};
use crate::BenchError;

/// One sample of a sender-process migration.
#[derive(Clone, Debug, Serialize)]
pub struct SenderSample {
    /// `thread` (the VMM sends) or the process's mapping mode.
    pub sender: String,
    /// Round.
    pub round: u32,
    /// Total migration time, ms.
    pub total_ms: f64,
    /// CPU cycles per page sent, the VMM's sending thread and the sender
    /// process together.
    pub cycles_per_page: f64,
}

pub(crate) fn sender_sample(
    exe: &Path,
    b: &MigrateBench,
    sender: &str,
    round: u32,
) -> Result<SenderSample, BenchError> {
    let cmdline = "workload=bm faulting=0 working=0 memory=64M seconds=8";
    let id = format!("{}-sender-{sender}-{round}", std::process::id());
    let body = if sender == "thread" {
        serde_json::json!({ "sender_process": null })
    } else {
        serde_json::json!({ "sender_process": sender })
    };
    let rep = migrate_once(exe, &b.transport, &[], ("1G", cmdline), body, &id)?.report;
    let num = |k: &str| rep[k].as_f64().unwrap_or(0.0);
    let pages = num("pages_sent").max(1.0);
    let tsc_khz = crate::hover_process::tsc_khz()? as f64;
    Ok(SenderSample {
        sender: sender.into(),
        round,
        total_ms: num("total_ms"),
        cycles_per_page: (num("sender_cpu_us") + num("sender_process_cpu_us")) * tsc_khz
            / 1000.0
            / pages,
    })
}

/// One sample of the mapping micro-benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct MapSample {
    /// The mapping mode.
    pub mode: String,
    /// Pages per request to the kernel (per-page mode: pages per batch
    /// the helper reads before it would send).
    pub batch_pages: usize,
    /// Round.
    pub round: u32,
    /// The sender process's CPU cycles per page read.
    pub cycles_per_page: f64,
}

/// Pages of the micro-benchmark's guest memory (64 MiB).
const MAP_PAGES: usize = 16384;

/// Every mode x batch once, in an order rotated by `round`.
pub(crate) fn map_samples(b: &MigrateBench, round: u32) -> Result<Vec<MapSample>, BenchError> {
    use hover_vmm::migration::mapper::MapMode;
    use hover_vmm::migration::sender::ProcessSender;
    let host = |what: &str, e: &dyn std::fmt::Display| guest(&format!("{what}: {e}"));
    let ram = hover_vmm::memory::GuestRam::new(
        (MAP_PAGES * 4096) as u64,
        hover_vmm::config::MemoryBackend::Memfd,
    )
    .map_err(|e| host("guest memory", &e))?;
    let gpas: Vec<u64> = (0..MAP_PAGES as u64).map(|i| i * 4096).collect();
    for &gpa in &gpas {
        use vm_memory::{Bytes, GuestAddress};
        ram.memory()
            .write_slice(&[gpa as u8 | 1; 4096], GuestAddress(gpa))
            .map_err(|e| host("filling guest memory", &e))?;
    }
    let null = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .map_err(|e| host("/dev/null", &e))?;
    let tsc_khz = crate::hover_process::tsc_khz()? as f64;
    let mut cells: Vec<(MapMode, usize)> = MapMode::ALL
        .into_iter()
        .flat_map(|m| b.batches.iter().map(move |&n| (m, n)))
        .collect();
    let n = cells.len();
    cells.rotate_left(round as usize % n);
    let mut out = Vec::new();
    for (mode, batch) in cells {
        let mut p = ProcessSender::spawn(mode, &ram, &null, batch, None)
            .map_err(|e| host("starting a sender process", &e))?;
        // Warm up: the helper's first request maps and faults in its own
        // buffers.
        p.read_only(&gpas[..batch])
            .map_err(|e| host("reading", &e))?;
        let cpu0 = p.cpu_us;
        for _ in 0..3 {
            p.read_only(&gpas).map_err(|e| host("reading", &e))?;
        }
        let pages = (3 * gpas.len()) as f64;
        out.push(MapSample {
            mode: mode.name().into(),
            batch_pages: batch,
            round,
            cycles_per_page: (p.cpu_us - cpu0) as f64 * tsc_khz / 1000.0 / pages,
        });
    }
    Ok(out)
}

/// The senders compared in part 2: the VMM's thread, then each mapping mode.
pub(crate) const SENDERS: [&str; 4] = ["thread", "per-page", "readv", "persistent"];

/// Per-round ratio `f(base) / f(s)` for the samples `of`, the base found
/// by `base_of` in the same round.
fn per_round<T>(
    of: &[&T],
    base_of: impl Fn(&T) -> Option<f64>,
    f: impl Fn(&T) -> f64,
) -> Option<Summary> {
    summarize(
        &of.iter()
            .filter_map(|s| Some(base_of(s)? / f(s).max(1e-9)))
            .collect::<Vec<_>>(),
    )
}

pub(crate) fn sender_table(senders: &[SenderSample]) -> (Vec<Vec<String>>, Vec<Value>) {
    let (mut rows, mut json) = (Vec::new(), Vec::new());
    for sender in SENDERS {
        let of: Vec<&SenderSample> = senders.iter().filter(|s| s.sender == sender).collect();
        let Some(total) = summarize(&of.iter().map(|s| s.total_ms).collect::<Vec<_>>()) else {
            continue;
        };
        let cpp = summarize(&of.iter().map(|s| s.cycles_per_page).collect::<Vec<_>>())
            .expect("same samples");
        let vs = per_round(
            &of,
            |s| {
                senders
                    .iter()
                    .find(|x| x.sender == "thread" && x.round == s.round)
                    .map(|x| x.total_ms)
            },
            |s| s.total_ms,
        );
        rows.push(vec![
            sender.to_string(),
            total.text(0),
            cpp.text(0),
            vs.map(|s| s.text(2)).unwrap_or_default(),
        ]);
        json.push(serde_json::json!({
            "sender": sender, "total_ms": total, "cycles_per_page": cpp, "time_vs_thread": vs,
        }));
    }
    (rows, json)
}

pub(crate) fn map_table(b: &MigrateBench, maps: &[MapSample]) -> (Vec<Vec<String>>, Vec<Value>) {
    let (mut rows, mut json) = (Vec::new(), Vec::new());
    for mode in hover_vmm::migration::mapper::MapMode::ALL {
        for &batch in &b.batches {
            let of: Vec<&MapSample> = maps
                .iter()
                .filter(|s| s.mode == mode.name() && s.batch_pages == batch)
                .collect();
            let Some(cpp) = summarize(&of.iter().map(|s| s.cycles_per_page).collect::<Vec<_>>())
            else {
                continue;
            };
            let vs = per_round(
                &of,
                |s| {
                    maps.iter()
                        .find(|x| {
                            x.mode == "per-page" && x.batch_pages == batch && x.round == s.round
                        })
                        .map(|x| x.cycles_per_page)
                },
                |s| s.cycles_per_page,
            );
            rows.push(vec![
                mode.name().to_string(),
                batch.to_string(),
                cpp.text(0),
                vs.map(|s| s.text(1)).unwrap_or_default(),
            ]);
            json.push(serde_json::json!({
                "mode": mode.name(), "batch_pages": batch, "cycles_per_page": cpp,
                "per_page_vs_this": vs,
            }));
        }
    }
    (rows, json)
}
