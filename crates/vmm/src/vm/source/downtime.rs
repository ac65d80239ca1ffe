//! The pause's stopwatch: from the moment the source stops the guest to
//! the destination's RUNNING, each part of the downtime and the gap the
//! guest itself saw.

use std::time::Instant;

use super::handshake::expect;
use super::link::Reader;
use crate::migration::message::Message;
use crate::migration::wire::Kind;
use crate::migration::{lap_us, DowntimeBreakdown, MigrationError, MigrationReport};
use crate::state;

/// The pause's stopwatch: when the guest stopped (host clock and TSC)
/// and each part of the downtime so far.
pub(in crate::vm) struct Downtime {
    paused_at: Instant,
    pause_tsc: u64,
    /// The parts measured so far.
    pub(in crate::vm) parts: DowntimeBreakdown,
    lap: Instant,
}

impl Downtime {
    /// The guest stops now.
    pub(in crate::vm) fn start() -> Downtime {
        let paused_at = Instant::now();
        Downtime {
            paused_at,
            pause_tsc: state::host_tsc(),
            parts: DowntimeBreakdown::default(),
            lap: paused_at,
        }
    }

    /// Microseconds since the last lap ended; the next begins.
    pub(in crate::vm) fn lap(&mut self) -> u64 {
        lap_us(&mut self.lap)
    }

    /// Wait for the destination's RUNNING and put the downtime figures in
    /// `report` (the guest's own TSC rate is `tsc_khz`).
    pub(in crate::vm) fn await_running(
        mut self,
        r: &mut Reader,
        report: &mut MigrationReport,
        tsc_khz: u32,
    ) -> Result<(), MigrationError> {
        let at = expect(r, Kind::Running, |m| match m {
            Message::Running(at) => Some(at),
            _ => None,
        })?;
        let waited = self.lap.elapsed().as_micros() as u64;
        if at.tsc != 0 {
            report.guest_downtime_ms =
                at.tsc.saturating_sub(self.pause_tsc) as f64 / tsc_khz.max(1) as f64;
        }
        self.parts.destination_load_us = at.load_us.min(waited);
        self.parts.ack_us = waited - self.parts.destination_load_us;
        report.downtime_breakdown = self.parts;
        report.downtime_ms = self.paused_at.elapsed().as_secs_f64() * 1e3;
        Ok(())
    }
}
