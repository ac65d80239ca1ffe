//! The destination side of a live migration (`hover receive`): wait for one
//! source, build the VM from its configuration, place the pages it sends,
//! load its state, and only then say RUNNING. A stream that is truncated,
//! corrupted or does not fit this host is refused with the frame and
//! offset, and no half-built VM ever runs.
//!
//! Everything that does not depend on the guest's final state is ready
//! before the source pauses: [`Vm::receive`] builds the VM (memory, vCPUs,
//! devices, pager) once the configuration arrives and says READY; [`Vm::run`]
//! starts every thread (vCPUs held, API, monitors) and only then takes the
//! rest of the stream ([`Running::arrive`]), whose SYNC the source waits
//! for before it pauses. So the source's pause holds the final pages and
//! the state's load; the RUNNING stamp is taken just before RUNNING is
//! sent, and the held vCPUs are let go right after (a message to each
//! thread: RUNNING first, so that a destination whose RUNNING was never
//! sent never runs the guest).
//!
//! No thread writes guest memory above the pinned boot area before the
//! state is in (the vCPUs are held; the monitors have no guest areas yet),
//! so the pager, registered from the start, never holds a page the stream
//! has yet to replace.

pub(super) mod postcopy;

use crate::sync::Locked;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};

use kvm_bindings::CpuId;

use super::control::{Command, VmEvent};
use super::persist::LoadError;
use super::restore::{check_saved_vcpus, prepare, RestoreOptions};
use super::run::Running;
use super::{open_console, Vm};
use crate::memory::paged::PageSource;
use crate::migration::auth::LinkAuth;
use crate::migration::message::{Digest, Message, Mode, PageSet, Pages, RunningFrame};
use crate::migration::opening::{self, Opened, Waiting};
use crate::migration::postcopy::incoming::{self, RemotePages};
use crate::migration::received::ReceivedPages;
use crate::migration::transport::{Addr, Conn, Listener};
use crate::migration::wire::{FrameReader, FrameWriter, Kind};
use crate::migration::MigrationError;
use crate::state::{self, memory, SavedMachine, VmState};
use crate::vcpu::state::StateError;
use crate::vcpu::thread::{VcpuMsg, VcpuReply};
use crate::Error;
use hover_abi::layout::PAGE_SIZE;
use postcopy::PinnedHash;

/// Tell the source why its migration was refused (if it still listens).
fn refuse(conn: &Conn, w: &mut FrameWriter<Conn>, e: &Error) {
    let msg = match e {
        Error::Migration(m) => m.to_string(),
        other => other.to_string(),
    };
    let _ = w.send(&Message::Error(msg));
    conn.shutdown();
}

/// How long the source may go quiet in the middle of a migration.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// Guest memory here digests to `want`, the source's digest (the frame
/// ended at stream offset `end_at`).
fn check_digest(vm: &Vm, want: u32, end_at: u64) -> Result<(), Cut> {
    let got = memory::digest(&vm.ram, vm.paging.pager()).map_err(host("digesting guest memory"))?;
    if got != want {
        return Err(Cut::Refused(Error::Migration(unfit(
            "DIGEST",
            end_at,
            format!("guest memory here digests to {got:#x}, the source's to {want:#x}"),
        ))));
    }
    Ok(())
}

/// A PAGES message's pages (its frame at `offset`) put where they go:
/// guest memory, or (above the pinned boot area) the pager's received
/// pages under a budget or a post-copy's kept ones; each pinned page noted
/// for the hash. How many.
fn place_pages(
    ram: &crate::memory::GuestRam,
    (pages, offset): (&Pages, u64),
    image_end: u64,
    mut pinned: Option<&mut PinnedHash>,
    (received, remote): (Option<&ReceivedPages>, Option<&RemotePages>),
) -> Result<u64, Cut> {
    let mig = |e: MigrationError| Cut::Refused(Error::Migration(e));
    for (gpa, page) in pages.iter() {
        if !ram.contains(gpa, PAGE_SIZE) {
            return Err(mig(unfit(
                "PAGES",
                offset,
                format!("page {gpa:#x} is outside guest memory"),
            )));
        }
        if let Some(p) = pinned.as_mut() {
            p.note(gpa, page);
        }
        let kept = match (received, remote) {
            _ if gpa < image_end => None,
            (Some(r), _) => Some(r.write(gpa, page)),
            (_, Some(r)) => Some(r.keep(gpa, page)),
            (None, None) => None,
        };
        match kept {
            Some(k) => k.map_err(|e| mig(MigrationError::Host(format!("keeping a page: {e}"))))?,
            _ => ram
                .memory()
                .write_slice(page, GuestAddress(gpa))
                .map_err(|e| mig(MigrationError::Host(e.to_string())))?,
        }
    }
    Ok(pages.gpas().len() as u64)
}

fn unfit(section: &'static str, offset: u64, reason: String) -> MigrationError {
    MigrationError::Unfit {
        section,
        offset,
        reason,
    }
}

/// The next frame, which must be of `kind` (checked before its payload
/// is decoded, so that a frame out of place is named as such), and where
/// it started.
fn next_of(r: &mut FrameReader<Conn>, kind: Kind) -> Result<(u64, Message), MigrationError> {
    let f = r.frame()?;
    let at = f.offset;
    if f.kind != kind {
        return Err(unfit(
            kind.name(),
            at,
            format!("found a {} frame", f.kind.name()),
        ));
    }
    Ok((at, Message::decode(f)?))
}

/// `found` (its frame at `offset`) came where `section` belongs.
fn misplaced(section: &'static str, offset: u64, found: &Message) -> MigrationError {
    unfit(
        section,
        offset,
        format!("found a {} frame", found.kind().name()),
    )
}

/// How `hover receive` waits for its source.
#[derive(Clone, Debug, Default)]
pub struct ReceiveOptions {
    /// Allow TCP without a migration key (`--insecure`).
    pub insecure: bool,
    /// Give up if no source has opened a stream by then (`--timeout`).
    pub timeout: Option<Duration>,
}

impl Vm {
    /// Listen at `listen`, call `on_listening` with the address (a TCP port
    /// 0 is chosen by the system), take one incoming VM and build it. The
    /// first connection to open a stream (a Hover hello and, where either
    /// end has a key, `opts.host.migration_key`, proofs of the same key)
    /// wins; one that fails (closed at once, garbage, another version,
    /// another key or none, not open within 5 s) is logged, told why if it
    /// listens, and dropped (migration/opening.rs). The listener closes once
    /// a stream is open, so a second source is refused. TCP without a key
    /// only if `insecure`; no stream by `timeout`: an error. Nothing runs
    /// until [`Vm::run`].
    pub fn receive(
        listen: &Addr,
        opts: &RestoreOptions,
        how: &ReceiveOptions,
        on_listening: impl FnOnce(&str),
    ) -> Result<Vm, Error> {
        opts.check()?;
        let key = opts.host.migration_key.clone();
        LinkAuth {
            key: key.clone(),
            insecure: how.insecure,
        }
        .check(
            listen,
            "give hover receive --migration-key FILE (the source's VMM the same key), or --insecure to take a VM from anyone who reaches the port",
        )
        .map_err(|e| Error::Migration(MigrationError::Auth(e.to_string())))?;
        let listener = Listener::bind(listen).map_err(|e| {
            Error::Migration(MigrationError::Host(format!(
                "cannot listen at {listen}: {e}"
            )))
        })?;
        let local = listener.local();
        // Before a byte of the stream is read, this thread is confined
        // (the VM it builds inherits nothing of it but the filter).
        crate::seccomp::set_mode(opts.host.seccomp);
        crate::seccomp::check(opts.host.seccomp)?;
        crate::seccomp::confine_control(opts.host.seccomp)?;
        on_listening(&local);
        // A broken post-copy is recovered at the address bound (TCP port 0
        // became a real port).
        let recover_at: Addr = local.parse().unwrap_or_else(|_| listen.clone());
        let waiting = Waiting {
            key,
            deadline: how.timeout.map(|t| Instant::now() + t),
            stop: None,
        };
        let Opened {
            conn,
            reader: mut r,
            writer: mut w,
        } = opening::wait(&listener, &waiting)
            .map_err(|e| Error::Migration(MigrationError::Waited(e)))?;
        drop(listener);
        let created_at = Instant::now();
        match Vm::begin_arrival(&conn, &mut r, &mut w, opts, created_at) {
            Ok((mut vm, a)) => {
                vm.arrival.arriving = Some(Box::new(Arriving {
                    conn,
                    r,
                    w,
                    recover_at,
                    parts: a,
                }));
                Ok(vm)
            }
            Err(e) => {
                refuse(&conn, &mut w, &e);
                Err(e)
            }
        }
    }

    /// Read the stream up to its pages: the configuration and the mode;
    /// build the VM (vCPUs, devices, pager) and say READY.
    fn begin_arrival(
        conn: &Conn,
        r: &mut FrameReader<Conn>,
        w: &mut FrameWriter<Conn>,
        opts: &RestoreOptions,
        created_at: Instant,
    ) -> Result<(Vm, ArrivingParts), Error> {
        let mig = |e: MigrationError| Error::Migration(e);
        conn.set_timeout(Some(IO_TIMEOUT))
            .map_err(host("setting the connection's timeout"))?;
        let (conf_at, conf) = next_of(r, Kind::Conf).map_err(mig)?;
        let saved: SavedMachine = match conf {
            Message::Conf(c) => *c,
            other => return Err(mig(misplaced("CONF", conf_at, &other))),
        };
        let (mode_at, mode) = next_of(r, Kind::Mode).map_err(mig)?;
        let Mode { postcopy, verify } = match mode {
            Message::Mode(m) => m,
            other => return Err(mig(misplaced("MODE", mode_at, &other))),
        };
        let p = prepare(&saved, opts).map_err(|e| load(e, "CONF", conf_at))?;
        let cpuid = p.set_cpuid().map_err(|e| load(e, "CONF", conf_at))?;
        let ram = &p.machine.ram;
        // Under a budget, memory above the boot area waits in a file for
        // the pager, so the budget holds from the first page.
        // So does every page of a post-copy: most arrive while the guest
        // runs, through the pager.
        let store = |()| {
            ReceivedPages::create(None, ram.end()).map_err(|e| {
                mig(MigrationError::Host(format!(
                    "a file for the arriving memory: {e}"
                )))
            })
        };
        let (received, remote) = if postcopy {
            let remote = Arc::new(RemotePages::new(
                store(())?,
                ram.end(),
                incoming::DEFAULT_PAGE_TIMEOUT,
            ));
            (None, Some(remote))
        } else if saved.config.memory_budget.is_some() {
            (Some(Arc::new(store(())?)), None)
        } else {
            (None, None)
        };
        let source = match (&received, &remote) {
            (Some(r), _) => Some(r.clone() as Arc<dyn PageSource>),
            (_, Some(r)) => Some(r.clone() as Arc<dyn PageSource>),
            (None, None) => None,
        };
        let sink = open_console(&p.config)?;
        let config = p.config;
        // The guest's TSC rate arrives with its state; the host's until then.
        let vm = Vm::assemble(p.machine, &config, saved.clone(), sink, source, created_at)?;
        // A signal ends the wait for the stream's next frame.
        vm.status.locked().hangup = Some(conn.try_clone().map_err(host("cloning the connection"))?);
        w.send(&Message::Ready)
            .map_err(host("answering the source"))?;
        Ok((
            vm,
            ArrivingParts {
                // With verification, a post-copy checks the boot area's
                // hash: kept up as its pages arrive, out of the downtime.
                pinned: (postcopy && verify).then(|| PinnedHash::new(saved.image_end)),
                saved,
                postcopy,
                received,
                remote,
                cpuid,
            },
        ))
    }
}

/// What [`Vm::begin_arrival`] learnt, for the rest of the stream.
pub(in crate::vm) struct ArrivingParts {
    saved: SavedMachine,
    postcopy: bool,
    pinned: Option<PinnedHash>,
    /// Pages above the boot area, under a memory budget (pre-copy).
    received: Option<Arc<ReceivedPages>>,
    /// Pages still on their way, in a post-copy.
    remote: Option<Arc<RemotePages>>,
    /// What each vCPU here offers, for the saved vCPUs' check.
    cpuid: Vec<CpuId>,
}

/// A migration under way into a built VM: the rest of its stream.
pub(in crate::vm) struct Arriving {
    conn: Conn,
    r: FrameReader<Conn>,
    w: FrameWriter<Conn>,
    /// Where a broken post-copy is recovered.
    recover_at: Addr,
    parts: ArrivingParts,
}

fn host(what: &str) -> impl Fn(std::io::Error) -> Error {
    let what = what.to_string();
    move |e| Error::Migration(MigrationError::Host(format!("{what}: {e}")))
}

fn load(e: LoadError, section: &'static str, offset: u64) -> Error {
    match e {
        LoadError::Unfit(_, reason) => Error::Migration(unfit(section, offset, reason)),
        LoadError::Host(e) => e,
    }
}

impl Running {
    /// Take the rest of an arriving migration's stream, with every thread
    /// of the VM started and its vCPUs held: pages, state, the end; load the
    /// state, say RUNNING and let the vCPUs go. A VM built any other way:
    /// nothing to do. Err: the stream was refused (the source is told) or
    /// a signal came first (Ok(Some(signal)): the run ends as a signal
    /// ends it); either way the vCPUs never ran.
    pub(in crate::vm) fn arrive(&mut self) -> Result<Option<i32>, Error> {
        let Some(a) = self.vm.arrival.arriving.take() else {
            return Ok(None);
        };
        let Arriving {
            conn,
            mut r,
            mut w,
            recover_at,
            parts,
        } = *a;
        let taken = self.take_rest(&mut r, &mut w, parts);
        self.vm.status.locked().hangup = None;
        let (remote, pinned_hash) = match taken {
            Ok(t) => t,
            Err(Cut::Signal(sig)) => {
                let e = Error::Migration(MigrationError::Host(format!(
                    "the destination was stopped by signal {sig} while the migration arrived"
                )));
                refuse(&conn, &mut w, &e);
                return Ok(Some(sig));
            }
            Err(Cut::Refused(e)) => {
                refuse(&conn, &mut w, &e);
                return Err(e);
            }
        };
        if let Some(remote) = remote {
            let w = w.hand_over(conn.try_clone().map_err(host("cloning the connection"))?);
            self.vm
                .start_incoming(remote, r, w, recover_at, pinned_hash)
                .map_err(host("starting the post-copy receiver"))?;
        }
        // Last: a source told RUNNING has let its guest go.
        self.broadcast(|| VcpuMsg::Resume)
            .map_err(|e| host("letting the vCPUs go")(std::io::Error::other(e.to_string())))?;
        Ok(None)
    }

    /// Load the arrived `s` (its frame at stream offset `state_at`): every
    /// held vCPU thread loads its own state at once.
    fn load_arrived_state(&mut self, s: &VmState, state_at: u64) -> Result<(), Cut> {
        let vcpus = &self.vcpus;
        self.vm
            .load_state_with(s, |states| {
                // Every held thread loads its own state at once; every
                // reply is read (the channels stay in step), the first
                // refusal reported.
                for (h, st) in vcpus.iter().zip(states) {
                    h.send(VcpuMsg::Restore(Box::new(st.clone())));
                }
                let replies: Vec<_> = vcpus.iter().map(|h| h.reply()).collect();
                replies
                    .into_iter()
                    .enumerate()
                    .try_for_each(|(i, r)| match r {
                        Some(VcpuReply::Restored(r)) => r.map_err(|e| (i, e)),
                        _ => Err((i, StateError::ThreadGone)),
                    })
            })
            .map_err(|e| load(e, "STATE", state_at))?;
        Ok(())
    }

    /// The frames after READY, up to RUNNING sent. Ok: a post-copy's page
    /// source and pinned hash, for its receiver.
    #[allow(clippy::type_complexity)]
    fn take_rest(
        &mut self,
        r: &mut FrameReader<Conn>,
        w: &mut FrameWriter<Conn>,
        parts: ArrivingParts,
    ) -> Result<(Option<Arc<RemotePages>>, Option<u64>), Cut> {
        let mig = |e: MigrationError| Cut::Refused(Error::Migration(e));
        let ArrivingParts {
            saved,
            postcopy,
            mut pinned,
            received,
            remote,
            cpuid,
        } = parts;
        let ram = &self.vm.ram;
        let (mut state, mut digest, mut pages): (Option<(u64, VmState)>, Option<u32>, u64) =
            (None, None, 0);
        loop {
            heed_events(&self.vm.events.rx, &mut self.stashed)?;
            let got = r.message().map_err(|e| {
                match heed_events(&self.vm.events.rx, &mut self.stashed) {
                    Err(stopped) => stopped,
                    Ok(()) => mig(e.into()),
                }
            })?;
            let at = got.offset;
            match got.message {
                Message::Pages(p) => {
                    pages += place_pages(
                        &self.vm.ram,
                        (&p, at),
                        saved.image_end,
                        pinned.as_mut(),
                        (received.as_deref(), remote.as_deref()),
                    )?;
                }
                Message::State(s) => {
                    if s.config != saved {
                        return Err(mig(unfit(
                            "STATE",
                            at,
                            "its configuration differs from the one sent first".into(),
                        )));
                    }
                    state = Some((at, *s));
                }
                Message::Digest(Digest::Memory(d)) => digest = Some(d),
                // The source waits for this before it pauses its guest,
                // so that the pause never waits behind a backlog here.
                Message::Sync => w
                    .send(&Message::Synced)
                    .map_err(host("answering the source"))?,
                Message::End if !postcopy => break,
                Message::Postcopy(set) if postcopy && state.is_some() => {
                    let remote = remote.as_ref().expect("post-copy has its page source");
                    still_at_source(&set, at, (ram.end(), saved.image_end), remote).map_err(mig)?;
                    break;
                }
                other => {
                    return Err(mig(unfit(
                        "stream",
                        at,
                        format!("a {} frame does not belong here", other.kind().name()),
                    )))
                }
            }
        }
        let end_at = r.offset();
        // The source's downtime from here on is ours too: timed for its report.
        let ended = Instant::now();
        let Some((state_at, s)) = state else {
            return Err(mig(unfit(
                "END",
                end_at,
                "the stream ended without the VM's state".into(),
            )));
        };
        check_saved_vcpus(&cpuid, &s.vcpus).map_err(|e| load(e, "STATE", state_at))?;
        // What the guest may change once it runs, hashed before it does.
        let pinned_hash = pinned.map(|p| p.sum());
        // Checked with the pager running: pages may wait in its source.
        if let Some(want) = digest {
            check_digest(&self.vm, want, end_at)?;
        }
        heed_events(&self.vm.events.rx, &mut self.stashed)?;
        self.load_arrived_state(&s, state_at)?;
        let how = match (&received, &remote) {
            (_, Some(_)) => "postcopy",
            (Some(_), _) => "lazy",
            (None, None) => "eager",
        };
        self.vm.mark_restored("a live migration".into(), how, pages);
        // The commit point: from here a signal no longer touches the link
        // (a post-copy's goes on serving the guest); one that came first
        // has shut the stream, and the guest never runs here.
        let hangup = self.vm.status.locked().hangup.take();
        heed_events(&self.vm.events.rx, &mut self.stashed)?;
        if hangup.is_none() {
            return Err(mig(MigrationError::Host(
                "the stream was shut before RUNNING".into(),
            )));
        }
        let running = RunningFrame {
            tsc: state::host_tsc(),
            load_us: ended.elapsed().as_micros() as u64,
        };
        w.send(&Message::Running(running))
            .map_err(host("answering the source"))?;
        Ok((remote, pinned_hash))
    }
}

/// A POSTCOPY message's pages (its frame at `offset`), for guest memory
/// ending at `end` with its pinned boot area below `image_end`, marked
/// pending in `remote`: none may be in the boot area, which must arrive
/// before the guest runs.
fn still_at_source(
    set: &PageSet,
    offset: u64,
    (end, image_end): (u64, u64),
    remote: &RemotePages,
) -> Result<(), MigrationError> {
    let gpas = set
        .pages(end)
        .map_err(|reason| unfit("POSTCOPY", offset, reason.to_string()))?;
    if let Some(g) = gpas.iter().find(|&&g| g < image_end) {
        return Err(unfit(
            "POSTCOPY",
            offset,
            format!(
                "page {g:#x} is in the pinned boot area, which must arrive before the guest runs"
            ),
        ));
    }
    remote
        .mark_pending(&gpas)
        .map_err(|reason| unfit("POSTCOPY", offset, reason.to_string()))
}

/// Why an arriving migration's stream was cut short.
enum Cut {
    /// A signal asked the VM to end.
    Signal(i32),
    /// The stream was refused, or the host failed.
    Refused(Error),
}

impl From<Error> for Cut {
    fn from(e: Error) -> Self {
        Cut::Refused(e)
    }
}

/// Err if the VM must not start: a signal asked it to end, or its pager
/// or a (held) vCPU thread failed while the migration arrived. Other events
/// wait in `stashed` for the control loop.
fn heed_events(
    events: &std::sync::mpsc::Receiver<VmEvent>,
    stashed: &mut std::collections::VecDeque<VmEvent>,
) -> Result<(), Cut> {
    while let Ok(ev) = events.try_recv() {
        let failed = match &ev {
            VmEvent::Command(Command::Signal(sig), _) => return Err(Cut::Signal(*sig)),
            VmEvent::PagerFailed(msg) => Some(format!("the pager failed: {msg}")),
            VmEvent::Vcpu(e) => Some(format!("a vCPU thread failed: {e:?}")),
            _ => None,
        };
        stashed.push_back(ev);
        if let Some(why) = failed {
            return Err(Cut::Refused(Error::Migration(MigrationError::Host(why))));
        }
    }
    Ok(())
}
