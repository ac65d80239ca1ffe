//! The source side of post-copy, run by the VM's control loop: the switch
//! (the pinned boot area and the state while paused, then the list of
//! pages still here), the post-copy phase that serves the destination, and
//! its recovery after a broken connection. The destination side is
//! `migration/postcopy/incoming.rs`, started by `vm/destination/`.

use std::time::Instant;

use super::super::control::{CommandError, Lifecycle, MigrationProgress};
use super::super::run::Running;
use super::handshake::{allowed, expect, open};
use super::link::{io, link, Reader, Writer};
use crate::migration::message::{Message, PageSet};
use crate::migration::page_sender::{pace_wait, PageSender};
use crate::migration::postcopy::outgoing::{Pending, Serve, ServeError};
use crate::migration::postcopy::{page_hash, Mode, PostcopyReport};
use crate::migration::transport::Conn;
use crate::migration::wire::Kind;
use crate::migration::{MigrateOptions, MigrationError, MigrationReport};
use crate::state::memory;
use hover_abi::layout::PAGE_SIZE;

/// Link time one background frame may take under a bandwidth limit.
const BACKGROUND_FRAME_S: f64 = 0.002;
/// The smallest background frame, pages.
const MIN_BACKGROUND_BATCH: usize = 16;
/// Pages hashed at a time for `verify`.
const HASH_CHUNK: usize = 256;

/// Where a pre-copy stands when it turns into post-copy (the guest paused).
pub(in crate::vm) struct Switch {
    pub(in crate::vm) w: Writer,
    pub(in crate::vm) r: Reader,
    /// Pages the destination lacks or holds stale.
    pub(in crate::vm) last: Vec<u64>,
    pub(in crate::vm) report: MigrationReport,
    pub(in crate::vm) sender: PageSender,
    /// The pause's stopwatch.
    pub(in crate::vm) down: super::Downtime,
    pub(in crate::vm) t0: Instant,
    /// Pages to push first.
    pub(in crate::vm) hot: Vec<u64>,
}

/// A post-copy phase that stopped on a broken connection: what a recovery
/// carries on with.
pub(in crate::vm) struct Interrupted {
    pending: Pending,
    hash: Option<u64>,
    report: MigrationReport,
    batch: usize,
    bandwidth: Option<u64>,
}

impl Running {
    /// Send the pinned area and the state, have the destination run the
    /// guest, and serve it every page still here.
    pub(in crate::vm) fn switch_to_postcopy(
        &mut self,
        o: &MigrateOptions,
        s: Switch,
    ) -> Result<MigrationReport, MigrationError> {
        let Switch {
            mut w,
            r,
            last,
            mut report,
            mut sender,
            mut down,
            t0,
            hot,
        } = s;
        let image_end = self.vm.image_end;
        let state = self
            .collect_state()
            .map_err(|e| MigrationError::Host(e.to_string()))?;
        // What loading the vCPUs' state touches goes now too: the
        // destination serves no page on demand before the state is in.
        let mut touched: Vec<u64> = state
            .vcpus
            .iter()
            .flat_map(|v| crate::vcpu::state::pv_area_pages(&v.msrs))
            .collect();
        touched.sort_unstable();
        let (pinned, rest): (Vec<u64>, Vec<u64>) = last
            .into_iter()
            .partition(|&g| g < image_end || touched.binary_search(&g).is_ok());
        // The pinned area is not paged at the destination: it goes now.
        let st = self.final_round(
            &mut sender,
            &mut w,
            &pinned,
            Some(state),
            &mut report,
            &mut down,
        )?;
        w.send(&Message::State(Box::new(st)))
            .map_err(link("sending the state"))?;
        let end = self.vm.ram.end();
        w.send(&Message::Postcopy(PageSet::of(rest.iter().copied(), end)))
            .map_err(link("sending the missing pages"))?;
        down.parts.state_us = down.lap();
        let mut r = r;
        down.await_running(&mut r, &mut report, self.vm.tsc_khz)?;
        report.mode = "postcopy".into();
        // From here on the guest runs there: this VM never resumes.
        let hash = match o.verify {
            true => Some(self.memory_hash().map_err(io("hashing guest memory"))?),
            false => None,
        };
        let mut pending = Pending::new(&rest, end);
        // A VM under the pager: the pages its guest touched first too
        // (`merge` takes ascending lists; the push goes in address order).
        let mut touched = self.vm.first_touches();
        touched.sort_unstable();
        touched.dedup();
        let hot_pages = pending.prioritize(&crate::migration::dirty::merge(hot, touched));
        let mut left = Interrupted {
            pending,
            hash,
            report,
            batch: o.batch_pages,
            bandwidth: o.bandwidth,
        };
        left.report.postcopy = Some(PostcopyReport {
            pages_at_switch: rest.len() as u64,
            hot_pages,
            ..Default::default()
        });
        let result = self.serve_postcopy(&mut left, r, w, Instant::now(), &mut sender);
        left.report.total_ms = t0.elapsed().as_secs_f64() * 1e3;
        left.report.pages_sent = sender.pages;
        left.report.throttled = sender.throttled;
        self.finish_postcopy(left, result)
    }

    /// Reconnect a post-copy phase that stopped on a broken connection.
    pub(in crate::vm) fn recover_postcopy(
        &mut self,
        o: &MigrateOptions,
    ) -> Result<MigrationReport, CommandError> {
        if self.state != Lifecycle::PostcopyPaused {
            return Err(CommandError::WrongState {
                state: self.state,
                action: "recover a post-copy migration",
                needs: "postcopy-paused",
            });
        }
        if !o.recover {
            return Err(CommandError::Invalid {
                field: "recover",
                reason: "this VM's post-copy migration broke off: only `recover` (to the same destination) carries it on".into(),
            });
        }
        allowed(self.vm.hosting.migration_key.as_ref(), &o.to, o.insecure).map_err(|e| {
            CommandError::Invalid {
                field: "to",
                reason: e.to_string(),
            }
        })?;
        let mut left = self
            .postcopy_left
            .take()
            .expect("a postcopy-paused VM keeps what is left");
        let t0 = Instant::now();
        let attempt = (|| -> Result<(Writer, Reader, Vec<u64>), MigrationError> {
            let conn = Conn::connect(&o.to, super::link::CONNECT_TIMEOUT).map_err(|source| {
                MigrationError::Connect {
                    to: o.to.to_string(),
                    source,
                }
            })?;
            conn.set_timeout(Some(super::link::IO_TIMEOUT))
                .map_err(io("setting the connection's timeout"))?;
            let (mut w, mut r) = open(&conn, self.vm.hosting.migration_key.as_deref())?;
            w.send(&Message::Recover)
                .map_err(link("asking to recover"))?;
            let missing = expect(&mut r, Kind::Missing, |m| match m {
                Message::Missing(set) => Some(set),
                _ => None,
            })?;
            let gpas =
                missing
                    .pages(self.vm.ram.end())
                    .map_err(|reason| MigrationError::Unfit {
                        section: "MISSING",
                        offset: 16,
                        reason: reason.to_string(),
                    })?;
            Ok((w, r, gpas))
        })();
        let (w, r, gpas) = match attempt {
            Ok(x) => x,
            Err(e) => {
                self.postcopy_left = Some(left);
                return Err(e.into());
            }
        };
        left.pending.reset(&gpas);
        let mut sender_stub = None;
        let result = self.serve_postcopy_with(&mut left, r, w, t0, &mut sender_stub);
        if let Some(pc) = left.report.postcopy.as_mut() {
            pc.recoveries += 1;
        }
        left.report.total_ms += t0.elapsed().as_secs_f64() * 1e3;
        self.finish_postcopy(left, result).map_err(Into::into)
    }

    fn serve_postcopy(
        &mut self,
        left: &mut Interrupted,
        r: Reader,
        w: Writer,
        started: Instant,
        sender: &mut PageSender,
    ) -> Result<(), ServeError> {
        let mut s = Some(sender);
        self.serve_postcopy_with(left, r, w, started, &mut s)
    }

    fn serve_postcopy_with(
        &mut self,
        left: &mut Interrupted,
        r: Reader,
        mut w: Writer,
        started: Instant,
        sender: &mut Option<&mut PageSender>,
    ) -> Result<(), ServeError> {
        self.progress(Some(MigrationProgress {
            mode: Mode::Postcopy,
            postcopy_pages_left: Some(left.pending.left()),
            ..Default::default()
        }));
        let (ram, pager) = (&self.vm.ram, self.vm.paging.pager());
        let bandwidth = left.bandwidth;
        let bytes0 = w.bytes;
        let mut read = |gpas: &[u64], out: &mut [u8]| memory::read_pages(ram, pager, gpas, out);
        let mut hold = |w: &Writer| pace_wait(bandwidth, started, w.bytes - bytes0);
        let pc = left.report.postcopy.get_or_insert_with(Default::default);
        let sent0 = pc.pages_received;
        // Under a bandwidth limit a request waits behind the frame in flight:
        // keep frames to ~2 ms of the link (seed 3's batching still holds
        // at 16 pages and up).
        let batch = bandwidth.map_or(left.batch, |bw| {
            ((bw as f64 * BACKGROUND_FRAME_S / PAGE_SIZE as f64) as usize)
                .clamp(MIN_BACKGROUND_BATCH.min(left.batch), left.batch)
        });
        let result = Serve {
            batch,
            end: ram.end(),
            hash: left.hash,
            read: &mut read,
            hold: &mut hold,
        }
        .run(r, &mut w, &mut left.pending, pc);
        let sent = pc.pages_received - sent0;
        left.report.bytes_sent += w.bytes;
        if let Some(s) = sender.as_mut() {
            s.pages += sent;
        } else {
            left.report.pages_sent += sent;
        }
        self.progress(None);
        result
    }

    fn finish_postcopy(
        &mut self,
        left: Interrupted,
        result: Result<(), ServeError>,
    ) -> Result<MigrationReport, MigrationError> {
        match result {
            Ok(()) => Ok(left.report),
            Err(e) => {
                let pages = left.pending.left();
                tracing::error!("post-copy stopped with {pages} pages still here: {e}");
                self.postcopy_left = Some(left);
                self.set_state(Lifecycle::PostcopyPaused, None);
                Err(MigrationError::PostcopyInterrupted(e.to_string()))
            }
        }
    }

    /// The order-free hash of guest memory ([`page_hash`] summed), read
    /// with the guest paused.
    fn memory_hash(&self) -> std::io::Result<u64> {
        let (ram, pager) = (&self.vm.ram, self.vm.paging.pager());
        let gpas = memory::pages_to_send(ram, pager)?;
        let ps = PAGE_SIZE as usize;
        let mut buf = vec![0u8; HASH_CHUNK * ps];
        let mut sum = 0u64;
        for chunk in gpas.chunks(HASH_CHUNK) {
            let out = &mut buf[..chunk.len() * ps];
            memory::read_pages(ram, pager, chunk, out)?;
            for (g, p) in chunk.iter().zip(out.chunks_exact(ps)) {
                sum = sum.wrapping_add(page_hash(*g, p));
            }
        }
        Ok(sum)
    }
}
