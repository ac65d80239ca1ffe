//! Post-copy migration (docs/MIGRATION.md): the source pauses, sends the
//! vCPU and device state and the pinned boot area, and the destination runs
//! the guest at once; every page still at the source is missing in the
//! destination's pager, which asks for it when the guest touches it, while
//! the source pushes the rest in the background. With async page faults the
//! guest parks the task that touched a remote page and runs others.
//!
//! `incoming` is the destination's half, `outgoing` the source's.

pub mod incoming;
pub mod outgoing;
pub mod remote;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How a migration moves memory (in JSON by the names `--mode` takes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every page before the guest runs at the destination.
    #[default]
    Precopy,
    /// The guest runs at the destination at once; memory follows.
    Postcopy,
    /// Pre-copy rounds, then post-copy when they stop converging (or on
    /// `PUT /vm/migrate/postcopy`).
    Hybrid,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        Ok(match s {
            "precopy" => Mode::Precopy,
            "postcopy" => Mode::Postcopy,
            "hybrid" => Mode::Hybrid,
            _ => {
                return Err(format!(
                    "unknown migration mode '{s}': use precopy, postcopy or hybrid"
                ))
            }
        })
    }
}

/// What the post-copy phase did, as each side saw it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PostcopyReport {
    /// Pages still at the source when the guest started at the destination.
    pub pages_at_switch: u64,
    /// Source: of those, the hot set pushed first (what the guest wrote in
    /// the last round before the pause).
    pub hot_pages: u64,
    /// Pages that crossed in the post-copy phase.
    pub pages_received: u64,
    /// Source: pages sent because the destination asked for them.
    pub demanded_sent: u64,
    /// Destination: guest touches of a page still at the source.
    pub demand_pages: u64,
    /// Destination: REQUEST frames sent.
    pub requests: u64,
    /// Destination: latency of a remote fault, from the touch to the page
    /// held here, microseconds (p50, p99, max).
    pub fault_p50_us: u64,
    /// See `fault_p50_us`.
    pub fault_p99_us: u64,
    /// See `fault_p50_us`.
    pub fault_max_us: u64,
    /// From the guest's start at the destination to the last page, ms.
    pub all_arrived_ms: f64,
    /// Broken connections recovered.
    pub recoveries: u32,
    /// With `verify`: whether memory as received hashed as the source's.
    pub verified: Option<bool>,
}

/// An order-free hash of one page of a memory image: summed (wrapping) over
/// the pages that are not all zeros, two images that hold the same have the
/// same sum whatever order the pages came in.
pub fn page_hash(gpa: u64, page: &[u8]) -> u64 {
    if crate::state::memory::is_zero(page) {
        return 0;
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&gpa.to_le_bytes());
    h.update(page);
    let lo = h.finalize() as u64;
    let mut h2 = crc32fast::Hasher::new_with_initial(0x9e37_79b9);
    h2.update(page);
    h2.update(&gpa.to_le_bytes());
    (h2.finalize() as u64) << 32 | lo
}

const BUCKETS: usize = 24;

/// Latencies in power-of-two microsecond buckets, for percentiles.
#[derive(Default)]
pub struct LatencyHist {
    buckets: [AtomicU64; BUCKETS],
    max_us: AtomicU64,
}

impl LatencyHist {
    /// Count one latency.
    pub fn record(&self, d: Duration) {
        let us = d.as_micros() as u64;
        let b = (64 - us.leading_zeros() as usize).min(BUCKETS - 1);
        self.buckets[b].fetch_add(1, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
    }

    /// p50, p99 (each the upper bound of its bucket, at most the maximum)
    /// and the maximum, microseconds; zeros when nothing was counted.
    pub fn percentiles(&self) -> (u64, u64, u64) {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        let max = self.max_us.load(Ordering::Relaxed);
        if total == 0 {
            return (0, 0, 0);
        }
        let at = |q: f64| {
            let want = ((total as f64 * q).ceil() as u64).max(1);
            let mut seen = 0;
            for (b, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= want {
                    return ((1u64 << b) - 1).min(max);
                }
            }
            max
        };
        (at(0.5), at(0.99), max)
    }
}

/// Why a post-copy's destination did not get every page (the run's
/// error: the guest cannot go on without them).
#[derive(Debug, thiserror::Error)]
pub enum PostcopyError {
    /// This host failed placing or keeping a page.
    #[error("{0}")]
    Local(String),
    /// The link broke and could not be waited on for a recovery.
    #[error("cannot listen at {at} for the recovery: {source}")]
    Listen {
        /// The recovery address.
        at: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The link broke and the wait for the source to come back failed.
    #[error("waiting for the recovery connection: {0}")]
    Recovery(String),
    /// The run ended while the guest waited for a recovery.
    #[error("the run ended while waiting for the source to come back: {0} pages of the guest's memory never arrived, the guest is lost")]
    NeverRecovered(u64),
    /// The run ended with memory still arriving.
    #[error("the run ended and memory was still arriving after {0:?}")]
    Unfinished(Duration),
    /// The receiving thread stopped without a report.
    #[error("the post-copy receiver stopped")]
    ReceiverGone,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse() {
        assert_eq!("hybrid".parse::<Mode>().unwrap(), Mode::Hybrid);
        assert!("later".parse::<Mode>().unwrap_err().contains("precopy"));
    }

    #[test]
    fn page_hashes_ignore_order_and_zeros() {
        let a = [1u8; 4096];
        let b = [2u8; 4096];
        let one = page_hash(0, &a).wrapping_add(page_hash(4096, &b));
        let other = page_hash(4096, &b).wrapping_add(page_hash(0, &a));
        assert_eq!(one, other);
        assert_eq!(page_hash(8192, &[0u8; 4096]), 0);
        assert_ne!(page_hash(0, &a), page_hash(4096, &a), "the address counts");
    }

    #[test]
    fn percentiles_come_from_the_buckets() {
        let h = LatencyHist::default();
        assert_eq!(h.percentiles(), (0, 0, 0));
        for _ in 0..99 {
            h.record(Duration::from_micros(100));
        }
        h.record(Duration::from_micros(5000));
        let (p50, p99, max) = h.percentiles();
        assert_eq!(p50, 127);
        assert_eq!(p99, 127);
        assert_eq!(max, 5000);
    }
}
