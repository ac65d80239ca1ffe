//! The source side of a live migration, run by the VM's control loop
//! (`Command::Migrate`): connect, send the configuration, then memory in
//! rounds while the guest runs, then pause for the last round and the
//! state, and end the run once the destination says the guest runs there.
//! Any failure turns dirty tracking off, resumes the guest (if this paused
//! it) and leaves the VM as it was.

mod downtime;
mod handshake;
mod link;
pub(super) mod postcopy;

use crate::sync::Locked;
use std::time::{Duration, Instant};

use super::control::{CommandError, Lifecycle, MigrationProgress, VmEvent};
use super::run::Running;
use crate::memory::host_writes::HostWrites;
use crate::migration::convergence::Decision;
use crate::migration::dirty::{merge, DirtyTracker};
use crate::migration::message::{self, Digest, Message};
use crate::migration::page_sender::PageSender;
use crate::migration::postcopy::Mode;
use crate::migration::precopy::{Dirty, Rounds, Sent};
use crate::migration::sender::ProcessSender;
use crate::migration::throttle::Ticker;
use crate::migration::transport::Conn;
use crate::migration::wire::Kind;
use crate::migration::{MigrateOptions, MigrationError, MigrationReport};
use crate::state::memory;
use crate::vcpu::VcpuEvent;
pub(in crate::vm) use downtime::Downtime;
use handshake::{allowed, catch_up, expect, handshake, open};
use link::{io, link, Writer, CONNECT_TIMEOUT, IO_TIMEOUT};

/// What the guest dirtied since the last harvest, with the monitor's own
/// writes to guest memory; the harvest's time goes in the report.
fn harvest(
    tracker: &mut dyn DirtyTracker,
    host_writes: &HostWrites,
    report: &mut MigrationReport,
) -> Result<Vec<u64>, MigrationError> {
    let at = Instant::now();
    let harvested = tracker.harvest()?;
    report.harvest_us.push(at.elapsed().as_micros() as u64);
    Ok(merge(harvested, host_writes.take()))
}

/// A migration under way: its stream, page sender and report, and the
/// pages still to send.
struct Outgoing {
    w: Writer,
    r: link::Reader,
    sender: PageSender,
    report: MigrationReport,
    pending: Vec<u64>,
}

impl Running {
    /// Migrate the VM to `o.to`. On success the run is to end: the guest
    /// runs at the destination.
    pub(in crate::vm) fn migrate(
        &mut self,
        o: &MigrateOptions,
    ) -> Result<MigrationReport, CommandError> {
        if let Err((field, reason)) = o.check() {
            return Err(CommandError::Invalid { field, reason });
        }
        if o.recover || self.state == Lifecycle::PostcopyPaused {
            return self.recover_postcopy(o);
        }
        if !matches!(self.state, Lifecycle::Running | Lifecycle::Paused) {
            return Err(CommandError::WrongState {
                state: self.state,
                action: "migrate",
                needs: "running or paused",
            });
        }
        if o.sender_process.is_some() && self.vm.paging.pager().is_some() {
            return Err(CommandError::Invalid {
                field: "sender_process",
                reason: "a VM under a pager (a memory budget, or a lazy restore) sends from its own thread: only it can read pages the pager holds elsewhere".into(),
            });
        }
        let mut tracker = self.tracker(o.tracker)?;
        if let Some(mode) = o.sender_process {
            if mode.needs_memfd() && self.vm.ram.backend() != crate::config::MemoryBackend::Memfd {
                return Err(CommandError::Invalid {
                    field: "sender_process",
                    reason: format!(
                        "a sender process that maps guest memory ({}) needs the VM started with --memory-backend memfd; readv works with either backend",
                        mode.name()
                    ),
                });
            }
        }
        allowed(self.vm.hosting.migration_key.as_ref(), &o.to, o.insecure).map_err(|e| {
            CommandError::Invalid {
                field: "to",
                reason: e.to_string(),
            }
        })?;
        let ring_full0 = self
            .vm
            .dirtying
            .rings
            .as_ref()
            .map_or(0, |r| r.full_exits());
        let slept0 = self.vm.dirtying.throttle.slept_us();
        let t0 = Instant::now();
        let cpu0 = crate::host::thread_cpu_us();
        let conn =
            Conn::connect(&o.to, CONNECT_TIMEOUT).map_err(|source| MigrationError::Connect {
                to: o.to.to_string(),
                source,
            })?;
        let was_running = self.state == Lifecycle::Running;
        let result = self.send_vm(o, &conn, tracker.as_mut(), t0);
        // Whatever happened, the guest runs at full speed from here.
        self.vm.dirtying.throttle.clear();
        self.progress(None);
        tracker.stop();
        self.vm.devices.host_writes.record(false);
        if result.is_err() && self.state != Lifecycle::PostcopyPaused {
            conn.shutdown();
            if was_running && self.state == Lifecycle::Paused {
                if let Err(e) = self.resume() {
                    tracing::error!("cannot resume the VM after a failed migration: {e}");
                }
            }
        }
        let mut report = result?;
        report.sender_cpu_us = crate::host::thread_cpu_us().saturating_sub(cpu0);
        report.ring_full_exits = self
            .vm
            .dirtying
            .rings
            .as_ref()
            .map_or(0, |r| r.full_exits() - ring_full0);
        report.vcpu_throttled_ms = self
            .vm
            .dirtying
            .throttle
            .slept_us()
            .iter()
            .zip(&slept0)
            .map(|(now, then)| now.saturating_sub(*then) as f64 / 1e3)
            .collect();
        Ok(report)
    }

    fn send_vm(
        &mut self,
        o: &MigrateOptions,
        conn: &Conn,
        tracker: &mut dyn DirtyTracker,
        t0: Instant,
    ) -> Result<MigrationReport, MigrationError> {
        let mut out = self.open_outgoing(o, conn, tracker)?;
        let (switch, ticker) = self.precopy_rounds(o, conn, tracker, &mut out, t0)?;
        let switch = self.before_pause(o, conn, tracker, &mut out, switch)?;
        // The guest stops in a moment: no more slowing down.
        self.vm.dirtying.throttle.clear();
        drop(ticker);
        self.pause_and_finish(o, tracker, out, switch, t0)
    }

    /// The stream opened and told what comes (configuration, mode),
    /// tracking on, round 0's pages listed; a pure post-copy's boot area
    /// sent at once.
    fn open_outgoing(
        &mut self,
        o: &MigrateOptions,
        conn: &Conn,
        tracker: &mut dyn DirtyTracker,
    ) -> Result<Outgoing, MigrationError> {
        // A stalled destination ends the migration within its timeout.
        conn.set_timeout(Some(IO_TIMEOUT.min(o.timeout)))
            .map_err(io("setting the connection's timeout"))?;
        let (mut w, mut r) = open(conn, self.vm.hosting.migration_key.as_deref())?;
        let config = self.saved_machine();
        handshake(
            w.send(&Message::Conf(Box::new(config))),
            "sending the configuration",
            &mut r,
        )?;
        let mode = message::Mode {
            postcopy: !matches!(o.mode, Mode::Precopy),
            verify: o.verify,
        };
        handshake(w.send(&Message::Mode(mode)), "sending the mode", &mut r)?;
        expect(&mut r, Kind::Ready, |m| {
            matches!(m, Message::Ready).then_some(())
        })?;

        tracker.start()?;
        self.vm.devices.host_writes.record(true);
        let mut report = MigrationReport {
            to: o.to.to_string(),
            mode: "precopy".into(),
            authenticated: w.mac().is_some(),
            tracker: tracker.name().into(),
            batch_pages: o.batch_pages,
            sender_process: o.sender_process,
            ..Default::default()
        };
        let process = match o.sender_process {
            Some(mode) => Some(
                ProcessSender::spawn(mode, &self.vm.ram, conn, o.batch_pages, w.mac()).map_err(
                    |e| MigrationError::Host(format!("starting the sender process: {e}")),
                )?,
            ),
            None => None,
        };
        let mut sender = PageSender::new(o.batch_pages, o.bandwidth, process);
        // Round 0: everything the guest has touched. Then what it dirtied.
        let mut pending = memory::pages_to_send(&self.vm.ram, self.vm.paging.pager())
            .map_err(io("listing guest memory"))?;
        // Counted from here.
        tracker.vcpu_dirty_pages();
        // Under way from here (a hybrid one can be told to switch).
        self.progress(Some(MigrationProgress {
            mode: o.mode,
            dirty_pages: pending.len() as u64,
            vcpu_throttle_pct: self.vm.dirtying.throttle.all(),
            ..Default::default()
        }));
        if o.mode == Mode::Postcopy {
            // Pure post-copy: the pinned boot area (which must be there
            // before the guest runs) crosses while the guest still runs
            // here, so the pause carries only what the guest dirties of it
            // meanwhile; everything above it follows the guest.
            let image_end = self.vm.image_end;
            let (pinned, rest): (Vec<u64>, Vec<u64>) =
                pending.into_iter().partition(|&g| g < image_end);
            let sent = sender.send(&self.vm.ram, self.vm.paging.pager(), &mut w, &pinned, true)?;
            report.round_pages.push(sent);
            report.rounds += 1;
            pending = rest;
        }
        Ok(Outgoing {
            w,
            r,
            sender,
            report,
            pending,
        })
    }

    /// The rounds while the guest runs, until the rest fits the pause
    /// (or, hybrid, post-copy takes over: `true`); the throttle's ticker,
    /// to stop once the guest pauses.
    fn precopy_rounds(
        &mut self,
        o: &MigrateOptions,
        conn: &Conn,
        tracker: &mut dyn DirtyTracker,
        out: &mut Outgoing,
        t0: Instant,
    ) -> Result<(bool, Option<Ticker>), MigrationError> {
        let Outgoing {
            w,
            sender,
            report,
            pending,
            ..
        } = out;
        let throttle = self.vm.dirtying.throttle.clone();
        let mut rounds = Rounds::new(o, throttle.all().len());
        let mut ticker = None;
        let mut switch = o.mode == Mode::Postcopy;
        while !switch {
            // A link that stalls mid-round ends the migration by its
            // --timeout, not a full I/O timeout later.
            let left = o.timeout.saturating_sub(t0.elapsed());
            conn.set_timeout(Some(IO_TIMEOUT.min(left).max(Duration::from_millis(200))))
                .map_err(io("setting the connection's timeout"))?;
            if let Some(e) = self.guest_ended() {
                self.stashed.push_back(e);
                return Err(MigrationError::GuestEnded);
            }
            match rounds.before_round(t0.elapsed()) {
                Decision::Postcopy => {
                    tracing::info!(
                        "hybrid migration: not converged within {}, switching to post-copy",
                        crate::config::duration_text(o.timeout)
                    );
                    switch = true;
                    break;
                }
                Decision::GiveUp => {
                    return Err(MigrationError::NoConvergence(
                        rounds.give_up(report.rounds, pending.len()),
                    ));
                }
                Decision::Pause => break,
                Decision::Continue => {}
            }
            let (start, bytes0) = (Instant::now(), sender.bytes(w));
            let sent = sender.send(
                &self.vm.ram,
                self.vm.paging.pager(),
                w,
                pending,
                report.rounds == 0,
            )?;
            report.round_pages.push(sent);
            report.rounds += 1;
            // Half the downtime may go to memory a tracker holds back.
            tracker.set_deferral_budget(rounds.sent(Sent {
                pages: sent,
                bytes: sender.bytes(w) - bytes0,
                took: start.elapsed(),
            }));
            *pending = harvest(tracker, &self.vm.devices.host_writes, report)?;
            let asked =
                o.mode == Mode::Hybrid && std::mem::take(&mut self.vm.status.locked().postcopy_now);
            let dirty = Dirty {
                pages: pending.len() as u64 + tracker.deferred_pages(),
                per_vcpu: tracker.vcpu_dirty_pages(),
                elapsed: t0.elapsed(),
                postcopy_asked: asked,
            };
            let step = rounds.round(sent, &dirty);
            let left = step.left;
            tracing::debug!(
                round = report.rounds,
                sent,
                dirty = dirty.pages,
                ?left,
                "pre-copy round"
            );
            self.progress(Some(MigrationProgress {
                mode: o.mode,
                postcopy_pages_left: None,
                round: report.rounds,
                pages_sent: sender.pages,
                dirty_pages: dirty.pages,
                rate_mb_s: rounds.rate() / 1e6,
                expected_downtime_ms: left.as_secs_f64().min(1e9) * 1e3,
                elapsed_ms: t0.elapsed().as_millis() as u64,
                vcpu_throttle_pct: throttle.all(),
            }));
            match step.decision {
                Decision::Pause => break,
                Decision::Postcopy => {
                    tracing::info!(asked, "hybrid migration: switching to post-copy");
                    switch = true;
                    break;
                }
                Decision::Continue | Decision::GiveUp => {}
            }
            if let Some(pct) = step.throttle {
                tracing::debug!(?pct, "throttling vCPUs");
                for (i, &p) in pct.iter().enumerate() {
                    throttle.set(i, p);
                }
                if ticker.is_none() {
                    let kickers = self.kickers();
                    let t = Ticker::start(throttle.clone(), move |i| {
                        if let Some(k) = kickers.get(i) {
                            k.kick();
                        }
                    })
                    .map_err(io("starting the throttle's ticker"))?;
                    ticker = Some(t);
                }
            }
        }
        report.vcpu_throttle_pct = rounds.peak().to_vec();
        Ok((switch, ticker))
    }

    /// Before the pause: the full I/O timeout again, and the destination
    /// caught up; whether the stream ends by post-copy.
    fn before_pause(
        &mut self,
        o: &MigrateOptions,
        conn: &Conn,
        tracker: &mut dyn DirtyTracker,
        out: &mut Outgoing,
        switch: bool,
    ) -> Result<bool, MigrationError> {
        let Outgoing {
            w,
            r,
            sender,
            report,
            pending,
        } = out;
        // The end (catching up, the final round, the destination's start)
        // gets the full I/O timeout again, whatever the rounds left of it.
        conn.set_timeout(Some(IO_TIMEOUT.min(o.timeout)))
            .map_err(io("setting the connection's timeout"))?;
        // Before the pause, the destination catches up with what has been
        // sent: a backlog in socket buffers or a relay (a slow link) would
        // otherwise drain inside the downtime (a hybrid switch's 185 ms
        // acknowledgement, 2026-11-25). Pages the guest dirties meanwhile
        // go in the final round; when the wait outlasted the downtime
        // target, one more round carries them first, while the guest runs.
        let mut drained = catch_up(w, r)?;
        if !switch && drained > o.downtime {
            let sent = sender.send(&self.vm.ram, self.vm.paging.pager(), w, pending, false)?;
            report.round_pages.push(sent);
            report.rounds += 1;
            *pending = harvest(tracker, &self.vm.devices.host_writes, report)?;
            drained += catch_up(w, r)?;
        }
        report.drain_us = drained.as_micros() as u64;
        // A hybrid migration whose rounds converged ends by the switch as
        // well: its destination was told the stream switches (and takes
        // no pre-copy end), and gets what is left, a few pages, on demand.
        let switch = switch || o.mode == Mode::Hybrid;
        Ok(switch)
    }

    /// The pause and the final round, then the state and the end of the
    /// stream (or the switch to post-copy); the report once the guest runs
    /// at the destination.
    fn pause_and_finish(
        &mut self,
        o: &MigrateOptions,
        tracker: &mut dyn DirtyTracker,
        out: Outgoing,
        switch: bool,
        t0: Instant,
    ) -> Result<MigrationReport, MigrationError> {
        let Outgoing {
            mut w,
            mut r,
            mut sender,
            mut report,
            pending,
        } = out;
        // The final round: the guest stops here.
        let mut down = Downtime::start();
        if self.state == Lifecycle::Running {
            self.pause()
                .map_err(|e| MigrationError::Host(e.to_string()))?;
        }
        down.parts.pause_us = down.lap();
        // A guest that powered off (or crashed) during the last round must
        // end here, not be moved: its exit waits in the event queue.
        if let Some(e) = self.guest_ended() {
            self.stashed.push_back(e);
            return Err(MigrationError::GuestEnded);
        }
        let harvest_at = Instant::now();
        let final_dirty = tracker.harvest_final()?;
        report
            .harvest_us
            .push(harvest_at.elapsed().as_micros() as u64);
        // What the guest was writing when it stopped: post-copy pushes it
        // first (pure post-copy had no rounds: only the last harvest), with
        // the pages a paged VM touched first (added once the guest runs
        // there: sorting them is no work for the pause).
        let hot = match (switch, o.mode) {
            (false, _) => Vec::new(),
            (true, Mode::Postcopy) => final_dirty.clone(),
            (true, _) => merge(pending.clone(), final_dirty.clone()),
        };
        let last = merge(
            merge(pending, final_dirty),
            self.vm.devices.host_writes.take(),
        );
        down.parts.final_harvest_us = down.lap();
        if switch {
            let switch = postcopy::Switch {
                w,
                r,
                last,
                report,
                sender,
                down,
                t0,
                hot,
            };
            return self.switch_to_postcopy(o, switch);
        }
        let st = self.final_round(&mut sender, &mut w, &last, None, &mut report, &mut down)?;
        w.send(&Message::State(Box::new(st)))
            .map_err(link("sending the state"))?;
        down.parts.state_us = down.lap();
        if o.verify {
            let d = memory::digest(&self.vm.ram, self.vm.paging.pager())
                .map_err(io("digesting guest memory"))?;
            w.send(&Message::Digest(Digest::Memory(d)))
                .map_err(link("sending the digest"))?;
        }
        down.parts.verify_us = down.lap();
        w.send(&Message::End).map_err(link("ending the stream"))?;
        down.await_running(&mut r, &mut report, self.vm.tsc_khz)?;
        report.total_ms = t0.elapsed().as_secs_f64() * 1e3;
        report.pages_sent = sender.pages;
        report.bytes_sent = sender.bytes(&w);
        report.sender_process_cpu_us = sender.process_cpu_us();
        report.throttled = sender.throttled;
        Ok(report)
    }

    pub(in crate::vm) fn progress(&self, p: Option<MigrationProgress>) {
        self.vm.status.locked().migration = p;
    }

    /// A vCPU event that arrived meanwhile (the guest powered off or
    /// crashed), if any; other events are kept for the control loop.
    pub(in crate::vm) fn guest_ended(&mut self) -> Option<VmEvent> {
        while let Ok(e) = self.vm.events.rx.try_recv() {
            match e {
                VmEvent::Vcpu(VcpuEvent::Exit { .. })
                | VmEvent::Vcpu(VcpuEvent::Reboot { .. })
                | VmEvent::Vcpu(VcpuEvent::Crash(_))
                | VmEvent::Vcpu(VcpuEvent::Failed { .. })
                | VmEvent::Vcpu(VcpuEvent::Panicked { .. })
                | VmEvent::PagerFailed(_) => return Some(e),
                other => self.stashed.push_back(other),
            }
        }
        None
    }
}

impl Running {
    /// The final round's `pages` out and the state (`state`, or gathered
    /// now; the VM is paused): how pre-copy ends and post-copy's switch
    /// begins.
    pub(in crate::vm) fn final_round(
        &self,
        sender: &mut PageSender,
        w: &mut Writer,
        pages: &[u64],
        state: Option<crate::state::VmState>,
        report: &mut MigrationReport,
        down: &mut Downtime,
    ) -> Result<crate::state::VmState, MigrationError> {
        let sent = sender.send(&self.vm.ram, self.vm.paging.pager(), w, pages, false)?;
        report.round_pages.push(sent);
        report.rounds += 1;
        down.parts.final_pages_us = down.lap();
        match state {
            Some(st) => Ok(st),
            None => self
                .collect_state()
                .map_err(|e| MigrationError::Host(e.to_string())),
        }
    }
}
