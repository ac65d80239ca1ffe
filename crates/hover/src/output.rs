//! How `hover run` prints an outcome: a short human summary, or JSON.

use hover_vmm::RunOutcome;

fn ms(us: u64) -> String {
    format!("{:.2} ms", us as f64 / 1000.0)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// Print the outcome for a person.
pub fn print_summary(o: &RunOutcome) {
    let t = &o.timings;
    println!(
        "hover: guest exited with code {} (from vCPU {})",
        o.exit_code, o.exit_vcpu
    );
    if !o.reports.is_empty() {
        println!("reports:");
        for r in &o.reports {
            println!("  vcpu {:<3} {} = {}", r.vcpu, r.key, r.value);
        }
    }
    let opt = |v: Option<u64>| v.map(ms).unwrap_or_else(|| "n/a".into());
    println!(
        "boot: setup {}, first instruction {}, first console byte {}, exit {}",
        ms(t.setup_us),
        opt(t.first_instruction_us),
        opt(t.first_console_byte_us),
        ms(t.exit_us)
    );
    if let Some(p) = &o.pager {
        println!(
            "pager: budget {} ({} pageable pages), {} resident; {} faults: {} zero-filled, {} read from the store (mean {:.1} us); {} evicted{}",
            mib(p.budget_pages * 4096),
            p.budget_pages,
            mib(p.resident_pages * 4096),
            p.faults,
            p.zero_fills,
            p.store_reads,
            p.fetch_latency_avg_us,
            p.evictions,
            if p.store_direct { "" } else { " (store without O_DIRECT)" }
        );
    }
    if let Some(h) = &o.halt_poll {
        let changes: Vec<String> = h
            .changes
            .iter()
            .map(|(t, w)| format!("{w} ns at {t} ms"))
            .collect();
        println!(
            "halt-poll governor (budget {}%): final window {} ns; changes: {}",
            h.budget_pct,
            h.final_window_ns,
            changes.join(", ")
        );
    }
    if !o.vcpu_cpu_us.is_empty() {
        let cpu: Vec<String> = o
            .vcpu_cpu_us
            .iter()
            .map(|us| format!("{:.1} ms", *us as f64 / 1000.0))
            .collect();
        println!("vCPU thread CPU time: {}", cpu.join(", "));
    }
    let m = &o.memory;
    println!(
        "memory: guest {} configured, {} resident; process {} resident; VMM overhead {}",
        mib(m.guest_memory),
        mib(m.guest_resident),
        mib(m.process_resident),
        mib(m.vmm_overhead)
    );
}

/// Print the outcome as one JSON document.
pub fn print_json(o: &RunOutcome) {
    match serde_json::to_string_pretty(o) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("hover: cannot encode the outcome as JSON: {e}"),
    }
}

/// Print KVM's statistics: the VM's, then one column per vCPU.
pub fn print_stats(o: &RunOutcome) {
    if o.vcpu_stats.is_empty() {
        println!("stats: this KVM has no binary statistics (KVM_GET_STATS_FD)");
        return;
    }
    println!("KVM VM statistics:");
    for (k, v) in &o.vm_stats {
        println!("  {k:<28} {v}");
    }
    print!("KVM vCPU statistics:\n  {:<28}", "");
    for i in 0..o.vcpu_stats.len() {
        print!(" {:>14}", format!("vcpu{i}"));
    }
    println!();
    for name in o.vcpu_stats[0].keys() {
        print!("  {name:<28}");
        for s in &o.vcpu_stats {
            print!(" {:>14}", s.get(name).copied().unwrap_or(0));
        }
        println!();
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
            println!(
                "  vcpu{i} {name} (bucket upper bound in KVM's unit:count) {}",
                cells.join(" ")
            );
        }
    }
}
