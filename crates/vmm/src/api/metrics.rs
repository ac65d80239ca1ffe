//! `GET /metrics`: the VM's figures in the Prometheus text exposition
//! (OpenMetrics), encoded by the `prometheus-client` crate. Everything is
//! read at scrape time: KVM's statistics of the VM and each vCPU (counters
//! for cumulative ones, gauges for instant and peak ones; histograms are
//! left to `GET /vm/stats`), the pager, the halt-poll governor and the I/O
//! device. Names: `hover_vcpu_<kvm name>{vcpu="N"}`, `hover_vm_<kvm name>`,
//! `hover_pager_*`, `hover_halt_poll_window_ns`,
//! `hover_guest_halt_poll_*{vcpu="N"}`, `hover_boost_*{vcpu="N"}`,
//! `hover_io_*`, `hover_balloon_*`, `hover_up`.

use crate::sync::Locked;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::LiveSources;
use crate::stats::StatKind;
use crate::vm::{Controller, Lifecycle};

/// The balloon's figures: its target and the guest's answer (gauges),
/// what it dropped (counters) and the guest's memory statistics (gauges,
/// as the guest last gave them).
fn balloon_families(b: &crate::devices::virtio::balloon::BalloonReport) -> Vec<Family> {
    let mut f = vec![
        Family::one(
            "balloon_target_pages",
            "pages the guest is asked to give back",
            false,
            u64::from(b.target_pages),
        ),
        Family::one(
            "balloon_actual_pages",
            "pages the guest says it gave back",
            false,
            u64::from(b.actual_pages),
        ),
        Family::one(
            "balloon_inflated_pages",
            "pages the guest handed over by inflating",
            true,
            b.inflated_pages,
        ),
        Family::one(
            "balloon_deflated_pages",
            "pages the guest took back by deflating",
            true,
            b.deflated_pages,
        ),
        Family::one(
            "balloon_reported_pages",
            "pages the guest reported free",
            true,
            b.reported_pages,
        ),
        Family::one(
            "balloon_dropped_pages",
            "pages dropped from host memory (inflated or reported)",
            true,
            b.dropped_pages,
        ),
    ];
    for (name, v) in &b.statistics {
        f.push(Family::one(
            &format!("balloon_guest_{name}"),
            "the guest's memory statistic of that name (virtio-balloon)",
            false,
            *v,
        ));
    }
    f
}

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Everything one scrape reports, read at once.
#[derive(Debug)]
struct Scrape {
    /// (name, help, counter?, [(labels, value)])
    families: Vec<Family>,
}

#[derive(Debug)]
struct Family {
    name: String,
    help: String,
    counter: bool,
    samples: Vec<(Vec<(String, String)>, u64)>,
}

impl Family {
    fn one(name: &str, help: &str, counter: bool, value: u64) -> Family {
        Family {
            name: name.into(),
            help: help.into(),
            counter,
            samples: vec![(Vec::new(), value)],
        }
    }
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.families {
            let kind = if f.counter {
                MetricType::Counter
            } else {
                MetricType::Gauge
            };
            let mut m = encoder.encode_descriptor(&f.name, &f.help, None, kind)?;
            let value = |v: u64, e: MetricEncoder| {
                if f.counter {
                    ConstCounter::new(v).encode(e)
                } else {
                    ConstGauge::new(v as i64).encode(e)
                }
            };
            match f.samples.as_slice() {
                // Without labels: an empty label set would print as `name{}`,
                // which some parsers refuse.
                [(labels, v)] if labels.is_empty() => value(*v, m)?,
                samples => {
                    for (labels, v) in samples {
                        value(*v, m.encode_family(labels)?)?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn kvm_families(
    prefix: &str,
    snaps: &[(Option<usize>, crate::stats::StatsSnapshot)],
) -> Vec<Family> {
    let Some((_, first)) = snaps.first() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for d in first.descriptors() {
        let counter = match d.kind {
            StatKind::Cumulative => true,
            StatKind::Instant | StatKind::Peak => false,
            _ => continue,
        };
        let samples = snaps
            .iter()
            .filter_map(|(vcpu, s)| {
                let labels = vcpu
                    .map(|i| vec![("vcpu".to_string(), i.to_string())])
                    .unwrap_or_default();
                s.get(&d.name).map(|v| (labels, v))
            })
            .collect();
        out.push(Family {
            name: format!("{prefix}_{}", d.name),
            help: format!("KVM statistic {} ({prefix})", d.name),
            counter,
            samples,
        });
    }
    out
}

/// The pager's families (a VM under a pager).
fn pager_families(p: &crate::memory::paged::PagerStats) -> Vec<Family> {
    let mut families = Vec::new();
    for (name, help, counter, v) in [
        (
            "pager_faults",
            "guest page faults the pager heard",
            true,
            p.faults,
        ),
        (
            "pager_zero_fills",
            "first touches served with zeros",
            true,
            p.zero_fills,
        ),
        (
            "pager_store_reads",
            "pages read back from the page store",
            true,
            p.store_reads,
        ),
        (
            "pager_source_reads",
            "pages read from the page source (snapshot)",
            true,
            p.source_reads,
        ),
        (
            "pager_evictions",
            "pages evicted to the page store",
            true,
            p.evictions,
        ),
        (
            "pager_resident_pages",
            "pageable pages resident now",
            false,
            p.resident_pages,
        ),
        (
            "pager_budget_pages",
            "pageable pages the budget allows",
            false,
            p.budget_pages,
        ),
        (
            "pager_discarded_pages",
            "pages dropped because the guest gave them up (balloon)",
            true,
            p.discarded_pages,
        ),
    ] {
        families.push(Family::one(name, help, counter, v));
    }
    families
}

/// Boosting's families, per vCPU.
fn boost_families(b: &crate::sched::boost::BoostReport) -> Vec<Family> {
    let mut families = Vec::new();
    type Field = fn(&crate::sched::boost::VcpuBoostStats) -> u64;
    let fields: [(&str, &str, Field); 11] = [
        ("boost_boosts", "vCPU thread boosts granted", |s| s.boosts),
        (
            "boost_unboosts",
            "boosts ended by the guest's unboost call",
            |s| s.unboosts,
        ),
        ("boost_throttles", "boosts revoked by the throttle", |s| {
            s.throttles
        }),
        (
            "boost_boosted_us",
            "wall time spent boosted, microseconds",
            |s| s.boosted_us,
        ),
        ("boost_errors", "boosts the OS refused", |s| s.errors),
        (
            "boost_kept",
            "unboost calls that kept the boost across a short gap (--boost-keep-us)",
            |s| s.kept,
        ),
        (
            "boost_budget_unboosts",
            "unboost calls that would have kept the boost but for its CPU budget",
            |s| s.budget_unboosts,
        ),
        (
            "boost_quiet_unboosts",
            "unboosts the guest made by a write to its area, without a call (--boost-keep-us)",
            |s| s.quiet_unboosts,
        ),
        (
            "boost_not_contended",
            "monitor passes that granted no boost for want of contention (--boost-when contended)",
            |s| s.not_contended,
        ),
        (
            "boost_host_ended_halted",
            "host-side boosts (no boost area: a Linux guest) ended as the vCPU halted",
            |s| s.host_ended_halted,
        ),
        (
            "boost_host_ended_budget",
            "host-side boosts ended at --boost-irq-us of the thread's CPU time",
            |s| s.host_ended_budget,
        ),
    ];
    for (name, help, f) in fields {
        families.push(Family {
            name: name.into(),
            help: help.into(),
            counter: true,
            samples: b
                .vcpus
                .iter()
                .enumerate()
                .map(|(i, s)| (vec![("vcpu".to_string(), i.to_string())], f(s)))
                .collect(),
        });
    }
    families
}

/// The guest's own halt polling, per vCPU.
fn guest_poll_families(g: &crate::sched::guest_poll::GuestPoll) -> Vec<Family> {
    let mut families = Vec::new();
    type Field = fn(&crate::sched::guest_poll::GuestPollVcpu) -> u64;
    let fields: [(&str, &str, bool, Field); 4] = [
        (
            "guest_halt_poll_window_ns",
            "the poll window the guest uses before it halts (idle=haltpoll)",
            false,
            |v| v.window_ns,
        ),
        (
            "guest_halt_poll_polls",
            "guest idle polls started",
            true,
            |v| v.polls,
        ),
        (
            "guest_halt_poll_hits",
            "guest idle polls that found work",
            true,
            |v| v.hits,
        ),
        (
            "guest_halt_poll_irqs_skipped",
            "I/O completion interrupts skipped: the guest was polling",
            true,
            |v| v.irqs_skipped,
        ),
    ];
    for (name, help, counter, f) in fields {
        families.push(Family {
            name: name.into(),
            help: help.into(),
            counter,
            samples: g
                .vcpus
                .iter()
                .enumerate()
                .map(|(i, s)| (vec![("vcpu".to_string(), i.to_string())], f(s)))
                .collect(),
        });
    }
    families.push(Family::one(
        "guest_halt_poll_max_ns",
        "the longest guest poll the monitor allows",
        false,
        g.max_ns,
    ));
    families
}

/// Read every source now and encode the exposition.
pub fn render(src: &LiveSources, controller: &Controller) -> String {
    let mut families = vec![Family::one(
        "up",
        "1 while the guest runs, 0 when paused or stopped",
        false,
        (controller.info().state == Lifecycle::Running) as u64,
    )];
    let vcpus: Vec<_> = src
        .vcpu_stats
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.read().ok().map(|s| (Some(i), s)))
        .collect();
    families.extend(kvm_families("vcpu", &vcpus));
    let vm: Vec<_> = src
        .vm_stats
        .iter()
        .filter_map(|s| s.read().ok().map(|s| (None, s)))
        .collect();
    families.extend(kvm_families("vm", &vm));
    if let Some(p) = src.pager.as_ref().map(|f| f()) {
        families.extend(pager_families(&p));
    }
    if let Some(b) = &src.balloon {
        families.extend(balloon_families(&b.report()));
    }
    let governor = src.governor.locked();
    if let Some(g) = governor.as_ref().map(|f| f()) {
        families.push(Family::one(
            "halt_poll_window_ns",
            "the halt-poll window the governor set",
            false,
            g.final_window_ns,
        ));
    }
    drop(governor);
    if let Some(b) = src.boost.as_ref().map(|b| b.report()) {
        families.extend(boost_families(&b));
    }
    if let Some(g) = src.guest_poll.as_ref().map(|f| f()) {
        families.extend(guest_poll_families(&g));
    }
    if let Some(io) = src.io.stats() {
        for (name, help, v) in [
            ("io_requests", "I/O requests completed", io.requests),
            (
                "io_bad_requests",
                "I/O requests refused as malformed",
                io.bad_requests,
            ),
            ("io_errors", "I/O requests whose write failed", io.io_errors),
            ("io_bytes", "bytes written by the I/O device", io.bytes),
        ] {
            families.push(Family::one(name, help, true, v));
        }
    }
    let mut registry = Registry::with_prefix("hover");
    registry.register_collector(Box::new(Scrape { families }));
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        out = "# the metrics could not be encoded\n# EOF\n".into();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_balloons_figures_and_the_guests_statistics_are_families() {
        let mut b = crate::devices::virtio::balloon::BalloonReport {
            target_pages: 256,
            reported_pages: 7,
            ..Default::default()
        };
        b.statistics.insert("free_memory".into(), 1 << 20);
        let f = balloon_families(&b);
        let get = |n: &str| f.iter().find(|f| f.name == n).expect(n);
        assert_eq!(get("balloon_target_pages").samples[0].1, 256);
        assert!(!get("balloon_target_pages").counter);
        assert!(get("balloon_reported_pages").counter);
        assert_eq!(get("balloon_guest_free_memory").samples[0].1, 1 << 20);
    }
}
