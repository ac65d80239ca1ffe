//! How `hover run` and `hover stats` print: a short human summary, or JSON.
//!
//! Writes go through `out!`, which ignores errors: when stdout is a closed
//! pipe (`hover run | head`), the VM has still run and its exit status still
//! tells how; printing must not turn that into a panic.

use std::io::Write;

macro_rules! out {
    ($w:expr, $($arg:tt)*) => {{
        let _ = writeln!($w, $($arg)*);
    }};
}

macro_rules! out_part {
    ($w:expr, $($arg:tt)*) => {{
        let _ = write!($w, $($arg)*);
    }};
}

use hover_vmm::{EndReason, RunOutcome};

fn ms(us: u64) -> String {
    format!("{:.2} ms", us as f64 / 1000.0)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// Print the outcome for a person.
pub fn print_summary(o: &RunOutcome) {
    let mut w = std::io::stdout().lock();
    let t = &o.timings;
    out!(w, "{}", ended_text(o));
    if let Some(r) = &o.restore {
        out!(
            w,
            "restored from {} ({} memory restore, {} pages loaded up front): running {} after the restore began",
            r.snapshot,
            r.memory_restore,
            r.pages_loaded,
            ms(r.to_running_us)
        );
    }
    if !o.reports.is_empty() {
        out!(w, "reports:");
        for r in &o.reports {
            out!(w, "  vcpu {:<3} {} = {}", r.vcpu, r.key, r.value);
        }
    }
    let opt = |v: Option<u64>| v.map(ms).unwrap_or_else(|| "n/a".into());
    out!(
        w,
        "boot: setup {}, first instruction {}, first console byte {}, exit {}",
        ms(t.setup_us),
        opt(t.first_instruction_us),
        opt(t.first_console_byte_us),
        ms(t.exit_us)
    );
    if let Some(p) = &o.pager {
        out!(w, "{}", pager_text(p));
    }
    if let Some(g) = o
        .guest_halt_poll
        .as_ref()
        .filter(|g| g.vcpus.iter().any(|v| v.polls > 0))
    {
        let windows: Vec<String> = g.vcpus.iter().map(|v| v.window_ns.to_string()).collect();
        out!(
            w,
            "guest halt polling (limit {} ns): windows [{}] ns; {} polls, {} found work; {} completion interrupts skipped",
            g.max_ns,
            windows.join(", "),
            g.vcpus.iter().map(|v| v.polls).sum::<u64>(),
            g.vcpus.iter().map(|v| v.hits).sum::<u64>(),
            g.irqs_skipped()
        );
    }
    if let Some(h) = &o.halt_poll {
        let changes: Vec<String> = h
            .changes
            .iter()
            .map(|(t, w)| format!("{w} ns at {t} ms"))
            .collect();
        out!(
            w,
            "halt-poll governor (budget {}%): final window {} ns; changes: {}",
            h.budget_pct,
            h.final_window_ns,
            changes.join(", ")
        );
    }
    if let Some(b) = &o.boost {
        let per: Vec<String> = b
            .vcpus
            .iter()
            .map(|s| {
                format!(
                    "{} boosts ({} request, {} interrupt, {} timer), {} unboosts, {} throttled, {:.1} ms boosted",
                    s.boosts,
                    s.boosts_request,
                    s.boosts_interrupt,
                    s.boosts_timer,
                    s.unboosts,
                    s.throttles,
                    s.boosted_us as f64 / 1000.0
                )
            })
            .collect();
        out!(
            w,
            "boost ({}, {}): {}",
            serde_json::to_value(b.mode)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            b.policy,
            per.join("; ")
        );
    }
    if !o.vcpu_cpu_us.is_empty() {
        let cpu: Vec<String> = o
            .vcpu_cpu_us
            .iter()
            .map(|us| format!("{:.1} ms", *us as f64 / 1000.0))
            .collect();
        out!(w, "vCPU thread CPU time: {}", cpu.join(", "));
    }
    let m = &o.memory;
    out!(
        w,
        "memory: guest {} configured, {} resident; process {} resident; VMM overhead {} (PSS {}, private {})",
        mib(m.guest_memory),
        mib(m.guest_resident),
        mib(m.process_resident),
        mib(m.vmm_overhead),
        mib(m.vmm_pss),
        mib(m.vmm_private)
    );
}

/// How the run ended, in one line.
fn ended_text(o: &RunOutcome) -> String {
    match (o.ended, o.exit_vcpu) {
        (EndReason::PowerOff, Some(vcpu)) => format!(
            "hover: guest exited with code {} (from vCPU {vcpu})",
            o.exit_code
        ),
        (EndReason::Reboot, _) => {
            "hover: the guest rebooted; the VM ended (start it again to boot anew)".into()
        }
        (EndReason::Shutdown, _) => {
            "hover: the VM was shut down (through its API, or Ctrl-A x on its console)".into()
        }
        (EndReason::Signal, _) => format!(
            "hover: the VM was ended by {} (exit status {})",
            hover_vmm::signals::name(o.exit_code as i32 - 128),
            o.exit_code
        ),
        (EndReason::Snapshot, _) => {
            "hover: the VM was stopped after a snapshot: it lives on in the file".into()
        }
        (EndReason::Migrated, _) => {
            "hover: the VM migrated: its guest runs at the destination".into()
        }
        (EndReason::PowerOff, None) => format!("hover: guest exited with code {}", o.exit_code),
    }
}

/// The pager's line of the outcome.
fn pager_text(p: &hover_vmm::memory::paged::PagerStats) -> String {
    let from_snapshot = if p.source_reads > 0 {
        format!(", {} read from the snapshot", p.source_reads)
    } else {
        String::new()
    };
    let store = match (p.evictions, p.store_direct) {
        (0, _) => "",
        (_, true) => "",
        (_, false) => " (store without O_DIRECT)",
    };
    // The budget covers the pageable region only: the pinned boot area
    // and guest image stay outside it (and a lazy restore's or a
    // post-copy destination's pager has no budget at all).
    let budget = if p.budget_pages >= p.pageable_pages {
        format!("no budget ({} pageable pages)", p.pageable_pages)
    } else {
        format!(
            "budget {} ({} of {} pageable pages; the pinned boot area and guest image are outside it)",
            mib(p.budget_pages * 4096),
            p.budget_pages,
            p.pageable_pages
        )
    };
    format!(
        "pager: {budget}, {} resident; {} faults: {} zero-filled{}, {} read from the store (mean {:.1} us); {} evicted ({}){}",
        mib(p.resident_pages * 4096),
        p.faults,
        p.zero_fills,
        from_snapshot,
        p.store_reads,
        p.fetch_latency_avg_us,
        p.evictions,
        p.evict_mode,
        store
    )
}

/// Print the outcome as one JSON document.
pub fn print_json(o: &RunOutcome) {
    let mut w = std::io::stdout().lock();
    match serde_json::to_string_pretty(o) {
        Ok(s) => out!(w, "{s}"),
        Err(e) => eprintln!("hover: cannot encode the outcome as JSON: {e}"),
    }
}

/// Print KVM's statistics: the VM's, then one column per vCPU.
pub fn print_stats(o: &RunOutcome) {
    let mut w = std::io::stdout().lock();
    if o.vcpu_stats.is_empty() {
        out!(
            w,
            "stats: this KVM has no binary statistics (KVM_GET_STATS_FD)"
        );
        return;
    }
    out!(w, "KVM VM statistics:");
    for (k, v) in &o.vm_stats {
        out!(w, "  {k:<28} {v}");
    }
    out_part!(w, "KVM vCPU statistics:\n  {:<28}", "");
    for i in 0..o.vcpu_stats.len() {
        out_part!(w, " {:>14}", format!("vcpu{i}"));
    }
    out!(w, "");
    for name in o.vcpu_stats[0].keys() {
        out_part!(w, "  {name:<28}");
        for s in &o.vcpu_stats {
            out_part!(w, " {:>14}", s.get(name).copied().unwrap_or(0));
        }
        out!(w, "");
    }
    for (i, hists) in o.vcpu_histograms.iter().enumerate() {
        for (name, buckets) in hists.iter().filter(|(_, b)| b.iter().any(|&n| n > 0)) {
            // Log2 buckets: bucket 0 is 0, bucket k covers [2^(k-1), 2^k).
            let cells: Vec<String> = buckets
                .iter()
                .enumerate()
                .filter(|(_, &n)| n > 0)
                .map(|(k, n)| format!("<{}:{n}", if k == 0 { 1 } else { 1u64 << k }))
                .collect();
            out!(
                w,
                "  vcpu{i} {name} (bucket upper bound in KVM's unit:count) {}",
                cells.join(" ")
            );
        }
    }
}

/// Print the answer to a `hover ctl` action for a person.
pub fn print_ctl(action: &str, v: &serde_json::Value) {
    let mut w = std::io::stdout().lock();
    match action {
        "stats" => {
            drop(w);
            print_live(v);
        }
        "get" => {
            let c = &v["config"];
            out!(
                w,
                "state: {}, up {:.1} s; {} vCPUs, {} MiB, cmdline {:?}{}",
                v["state"].as_str().unwrap_or("?"),
                v["uptime_ms"].as_f64().unwrap_or(0.0) / 1000.0,
                c["vcpus"],
                c["memory"].as_u64().unwrap_or(0) >> 20,
                c["cmdline"].as_str().unwrap_or(""),
                v["restored_from"]
                    .as_str()
                    .map(|p| format!("; restored from {p}"))
                    .unwrap_or_default()
            );
            out!(w, "halt polling: {}", halt_poll_text(&c["halt_poll"]));
            out!(w, "{}", boost_text(&c["boost"]));
            let m = &v["migration"];
            if m.is_object() {
                out!(
                    w,
                    "migrating ({}): round {}, {} pages sent, {} dirty, {:.0} MB/s, expected downtime {:.1} ms, {:.1} s so far",
                    m["mode"].as_str().unwrap_or("precopy"),
                    m["round"],
                    m["pages_sent"],
                    m["dirty_pages"],
                    m["rate_mb_s"].as_f64().unwrap_or(0.0),
                    m["expected_downtime_ms"].as_f64().unwrap_or(0.0),
                    m["elapsed_ms"].as_f64().unwrap_or(0.0) / 1000.0
                );
            } else {
                out!(w, "migration: none under way");
            }
        }
        "pause" => out!(
            w,
            "paused: every vCPU stopped {:.3} ms after the request",
            v["pause_us"].as_f64().unwrap_or(0.0) / 1000.0
        ),
        "snapshot" => out!(
            w,
            "snapshot {}: {}, {} guest pages; the VM was paused {:.2} ms{}",
            v["path"].as_str().unwrap_or("?"),
            mib(v["bytes"].as_u64().unwrap_or(0)),
            v["pages"],
            v["paused_us"].as_f64().unwrap_or(0.0) / 1000.0,
            if v["stopped"].as_bool() == Some(true) {
                " and has stopped"
            } else {
                ", and runs on"
            }
        ),
        "balloon" => out!(w, "{}", balloon_text(v)),
        "halt-poll" => out!(w, "halt polling: {}", halt_poll_text(&v["halt_poll"])),
        "boost" => out!(w, "{}", boost_text(&v["boost"])),
        "migrate" => out!(
            w,
            "migrated to {}: {} rounds, {} pages ({:.1} MiB) in {:.1} ms; downtime {:.2} ms (the guest saw {:.2} ms)",
            v["to"].as_str().unwrap_or("?"),
            v["rounds"],
            v["pages_sent"],
            v["bytes_sent"].as_f64().unwrap_or(0.0) / (1 << 20) as f64,
            v["total_ms"].as_f64().unwrap_or(0.0),
            v["downtime_ms"].as_f64().unwrap_or(0.0),
            v["guest_downtime_ms"].as_f64().unwrap_or(0.0)
        ),
        _ => match v["state"].as_str().unwrap_or("?") {
            "exited" => out!(w, "{action}: the VM has ended"),
            state => out!(w, "{action}: the VM is {state}"),
        },
    }
}

/// Print a live snapshot (the API socket's answer) for a person.
pub fn print_live(v: &serde_json::Value) {
    let mut w = std::io::stdout().lock();
    out!(
        w,
        "uptime: {:.1} s",
        v["uptime_ms"].as_f64().unwrap_or(0.0) / 1000.0
    );
    let keys = [
        "exits",
        "halt_exits",
        "halt_successful_poll",
        "halt_attempted_poll",
        "irq_injections",
        "pf_guest",
    ];
    if let Some(vcpus) = v["vcpu_stats"].as_array() {
        out_part!(w, "{:<22}", "");
        for i in 0..vcpus.len() {
            out_part!(w, " {:>12}", format!("vcpu{i}"));
        }
        out!(w, "");
        for k in keys {
            out_part!(w, "{k:<22}");
            for s in vcpus {
                out_part!(w, " {:>12}", s[k].as_u64().unwrap_or(0));
            }
            out!(w, "");
        }
    }
    let p = &v["pager"];
    if !p.is_null() {
        out!(
            w,
            "pager: {} of {} budget pages resident; {} faults, {} read from the store, {} evicted",
            p["resident_pages"],
            p["budget_pages"],
            p["faults"],
            p["store_reads"],
            p["evictions"]
        );
    }
    let b = &v["balloon"];
    if !b.is_null() {
        out!(w, "{}", balloon_text(b));
    }
    let h = &v["halt_poll"];
    if !h.is_null() {
        out!(
            w,
            "halt-poll governor: window {} ns (budget {}%, guest polls took {:.2}%)",
            h["final_window_ns"],
            h["budget_pct"],
            h["guest_poll_cost_pct"].as_f64().unwrap_or(0.0)
        );
    }
    let g = &v["guest_halt_poll"];
    if let Some(vcpus) = g["vcpus"].as_array() {
        let per: Vec<String> = vcpus
            .iter()
            .map(|s| {
                format!(
                    "{} ns, {} polls, {} hits",
                    s["window_ns"], s["polls"], s["hits"]
                )
            })
            .collect();
        out!(
            w,
            "guest halt polling (limit {} ns): {}",
            g["max_ns"],
            per.join("; ")
        );
    }
    let b = &v["boost"];
    if let Some(vcpus) = b["vcpus"].as_array() {
        let per: Vec<String> = vcpus
            .iter()
            .map(|s| format!("{} boosts, {} throttled", s["boosts"], s["throttles"]))
            .collect();
        out!(w, "boost ({}): {}", b["policy"], per.join("; "));
    }
    let io = &v["io"];
    if !io.is_null() {
        out!(
            w,
            "I/O device: {} requests, {} bytes, {} errors",
            io["requests"],
            io["bytes"],
            io["io_errors"]
        );
    }
}

/// Halt polling as the API gives it (`config.halt_poll`, and `PUT
/// /vm/halt-poll`'s answer): `{"mode": "fixed", "window_ns": N}`,
/// `{"mode": "auto", "budget_pct": P}` or `{"mode": "kvm-default"}`.
fn halt_poll_text(h: &serde_json::Value) -> String {
    match h["mode"].as_str() {
        Some("fixed") => format!("fixed window {} ns", h["window_ns"]),
        Some("auto") => format!("governor, budget {}% of a CPU per vCPU", h["budget_pct"]),
        Some("kvm-default" | "kvm_default") => "KVM's module default".into(),
        _ => h.to_string(),
    }
}

/// Boosting's settings as the API gives them (`config.boost`, and `PUT
/// /vm/boost`'s answer, which adds this host's tuning).
fn boost_text(b: &serde_json::Value) -> String {
    let Some(mode) = b["mode"].as_str() else {
        return "boosting: off".into();
    };
    let mut settings = format!(
        "policy {}, at most {} ms per boost, cooldown {} ms, {} boosts/s, monitor every {} us",
        policy_text(&b["policy"]),
        b["max_ms"],
        b["cooldown_ms"],
        b["max_rate"],
        b["poll_us"]
    );
    if b["when"].is_string() {
        settings += &format!(
            "; granted {}, kept across gaps up to {} us, host-side boosts up to {} us of CPU",
            b["when"].as_str().unwrap_or("?"),
            b["keep_us"],
            b["irq_us"]
        );
    }
    match mode {
        // Its settings still shown: a change made while off (ctl boost
        // --max-ms) is what a later --mode dynamic uses.
        "off" => format!("boosting: off (when on: {settings})"),
        mode => format!("boosting: {mode}, {settings}"),
    }
}

/// A boost policy as the API gives it: the flags' text (`fifo:10`).
fn policy_text(p: &serde_json::Value) -> String {
    p.as_str()
        .map(str::to_string)
        .unwrap_or_else(|| p.to_string())
}

/// One line of a balloon report (`ctl balloon`, `ctl stats`).
fn balloon_text(b: &serde_json::Value) -> String {
    let n = |k: &str| b[k].as_u64().unwrap_or(0);
    let free = b["statistics"]["free_memory"]
        .as_u64()
        .map(|f| format!("; the guest has {} free", mib(f)))
        .unwrap_or_default();
    format!(
        "balloon: target {} MiB, the guest holds {} MiB; {} pages dropped ({} inflated, {} reported free in {} reports){}{free}",
        n("target_mib"),
        n("actual_mib"),
        n("dropped_pages"),
        n("inflated_pages"),
        n("reported_pages"),
        n("reports"),
        if b["free_page_reporting"].as_bool() == Some(true) {
            ""
        } else {
            "; free page reporting off"
        }
    )
}
