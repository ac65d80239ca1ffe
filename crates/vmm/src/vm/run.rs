//! Running a VM: its vCPU threads, and the control loop that hears vCPU
//! events and commands until the run ends.

use crate::sync::Locked;
use std::collections::VecDeque;

use std::time::{Duration, Instant};

use kvm_bindings::{kvm_msr_entry, Msrs};

use super::api_host::{ApiHost, LiveSources};
use super::control::{Command, CommandError, Lifecycle, Reply, VmEvent};
use super::outcome::{us_since, EndReason, RunOutcome};
use super::Vm;
use crate::config::BoostUpdate;
use crate::config::HaltPoll;
use crate::memory::paged::PagerStats;
use crate::sched::boost::UpdateError;
use crate::sched::halt_poll::{HaltPollControl, HaltPollError};
use crate::state;
use crate::stats::KvmStats;
use crate::vcpu::thread::{Kicker, VcpuHandle, VcpuMsg, VcpuReply};
use crate::vcpu::{GuestCrash, VcpuEvent};
use crate::{Error, KvmOp};

const MSR_IA32_TSC: u32 = 0x10;

/// How a run ended, before it is turned into an outcome or an error.
enum End {
    PowerOff { vcpu: usize, code: u32 },
    Reboot { vcpu: usize },
    Crash(GuestCrash),
    Failed(kvm_ioctls::Error),
    Pager(String),
    VcpuGone(usize),
    Shutdown,
    Signal(i32),
    Snapshot,
    Migrated,
}

impl End {
    /// Why the run ended, the guest's exit code and the vCPU that ended it;
    /// or the error a run that failed returns.
    fn reason(self) -> Result<(EndReason, u32, Option<usize>), Error> {
        Ok(match self {
            End::PowerOff { vcpu, code } => (EndReason::PowerOff, code, Some(vcpu)),
            End::Reboot { vcpu } => (EndReason::Reboot, 0, Some(vcpu)),
            End::Shutdown => (EndReason::Shutdown, 0, None),
            End::Signal(s) => (
                EndReason::Signal,
                u32::from(crate::signals::exit_status(s)),
                None,
            ),
            End::Snapshot => (EndReason::Snapshot, 0, None),
            End::Migrated => (EndReason::Migrated, 0, None),
            End::Crash(crash) => return Err(Error::GuestCrash(Box::new(crash))),
            End::Failed(error) => return Err(KvmOp::Run.err()(error)),
            End::Pager(msg) => return Err(Error::PagerFailed(msg)),
            End::VcpuGone(vcpu) => {
                return Err(Error::Host {
                    what: "run the vCPUs",
                    source: std::io::Error::other(format!("the thread of vCPU {vcpu} panicked")),
                })
            }
        })
    }
}

/// A VM whose vCPU threads run.
pub(super) struct Running {
    pub(super) vm: Vm,
    pub(super) vcpus: Vec<VcpuHandle>,
    pub(super) state: Lifecycle,
    /// Events taken off the channel during a long command, to handle next.
    pub(super) stashed: VecDeque<VmEvent>,
    /// Halt polling, as set and changed live.
    halt_poll: HaltPollControl,
    /// A post-copy phase that broke off, kept for its recovery.
    pub(super) postcopy_left: Option<super::source::postcopy::Interrupted>,
}

impl Vm {
    /// Serve this VM's API through `host` while it runs (`api::SocketApi`
    /// for `--api-socket`; `api::SlotApi` in the Firecracker API's server,
    /// which listens before the VM exists and goes on after it).
    pub fn serve_api(&mut self, host: Box<dyn ApiHost>) {
        self.hosting.api = Some(host);
    }

    /// Run every vCPU on its own thread until the guest powers off or a
    /// command ends the run (returns the outcome), or the guest crashes
    /// (returns [`Error::GuestCrash`] with a register dump). Every thread
    /// of the VM has ended when this returns.
    pub fn run(self) -> Result<RunOutcome, Error> {
        // The run may be on another thread than the one that built the VM.
        crate::host::block_file_size_signal();
        crate::seccomp::set_mode(self.hosting.seccomp);
        let tsc_ref = match (&self.arrival.restored, &self.arrival.arriving) {
            (None, None) => Some(self.read_guest_tsc()?),
            _ => None,
        };
        let mut r = Running::new(self)?;
        let started_at = Instant::now();
        // Served once the vCPUs run (below): bound now, so that a socket
        // path in the way fails the start.
        let mut api = r.vm.hosting.api.take();
        if let Some(host) = api.as_mut() {
            host.start(r.live_sources(started_at), r.vm.controller())?;
        }
        r.vm.booster.start().map_err(|source| Error::Host {
            what: "start the boost monitor",
            source,
        })?;
        let spawned = r.spawn_vcpus().and_then(|()| {
            let c = r.vm.controller();
            r.vm.devices
                .start_console_input(Box::new(move || c.send(Command::Shutdown)))
        });
        // A prefetching restore's loader begins once the vCPUs run.
        r.vm.begin_prefetch();
        // Every thread runs: from here this one is confined too.
        let spawned = spawned
            .and_then(|()| {
                crate::seccomp::confine_control(r.vm.hosting.seccomp).map_err(Error::from)
            })
            // An arriving migration's state, now that everything else runs.
            .and_then(|()| r.arrive())
            .inspect(|_| {
                // A restored or arrived guest's virtio requests queued
                // before its state was taken are served now (a new VM has
                // no queue ready yet: nothing happens).
                r.vm.devices.kick_virtio();
            });
        let end = match spawned {
            Ok(Some(signal)) => Ok(End::Signal(signal)),
            Ok(None) => {
                if let Some(rep) = r.vm.arrival.restored.as_mut() {
                    rep.to_running_us = us_since(r.vm.hosting.created_at, Instant::now());
                    rep.running_tsc = state::host_tsc();
                }
                r.set_state(Lifecycle::Running, Some(started_at));
                if r.vm.hosting.start_paused {
                    // The vCPUs started paused: freeze the rest as a pause does.
                    r.vm.devices.pause();
                    r.vm.booster.pause();
                    r.set_state(Lifecycle::Paused, None);
                }
                // Clients find the API once the vCPUs run (a client that
                // saw the socket early found a VM it could not pause yet).
                let published = match api.as_mut() {
                    Some(host) => host.publish(),
                    None => Ok(()),
                };
                published.and_then(|()| r.serve())
            }
            Err(e) => Err(e),
        };
        let exited_at = Instant::now();
        r.set_state(Lifecycle::Exited, None);
        let cpu_us: Vec<u64> = r.vcpus.drain(..).map(|h| h.stop().unwrap_or(0)).collect();
        r.vm.devices.stop_console_input();
        r.vm.devices.stop_virtio();
        r.vm.booster.stop();
        // Before the pager stops: its fetches may wait on pages in flight.
        let postcopy = r.vm.arrival.postcopy_in.take().map(|p| p.finish());
        if let Some(mut host) = api {
            host.stop();
        }
        r.vm.devices.bus.serial.flush();
        if let Some(p) = r.vm.paging.pager_mut() {
            p.stop();
        }
        r.halt_poll.stop();
        r.vm.devices.pvio.stop();
        let (ended, exit_code, exit_vcpu) = end?.reason()?;
        let mut outcome = super::outcome::collect(
            &r.vm,
            r.halt_poll.last_report(),
            ended,
            exit_code,
            exit_vcpu,
            tsc_ref,
            started_at,
            exited_at,
            cpu_us,
        );
        outcome.postcopy = match postcopy {
            Some(Ok(report)) => Some(report),
            Some(Err(e)) => return Err(Error::Migration(e.into())),
            None => None,
        };
        Ok(outcome)
    }

    /// The guest's TSC now, paired with the host instant: lets the guest's
    /// own `boot_tsc` report be placed on the host's clock.
    fn read_guest_tsc(&self) -> Result<(Instant, u64), Error> {
        let mut msrs = Msrs::from_entries(&[kvm_msr_entry {
            index: MSR_IA32_TSC,
            ..Default::default()
        }])
        .map_err(|e| Error::Host {
            what: "build an MSR list",
            source: std::io::Error::other(format!("{e:?}")),
        })?;
        let now = Instant::now();
        self.vcpus[0]
            .fd()
            .get_msrs(&mut msrs)
            .map_err(KvmOp::GetMsrs.err())?;
        Ok((now, msrs.as_slice()[0].data))
    }
}

impl Running {
    /// The VM about to run: its halt polling as configured (the governor
    /// started under `auto`), no vCPU thread yet.
    fn new(vm: Vm) -> Result<Running, Error> {
        let governor_stats = vm
            .kvm_stats
            .vcpus
            .iter()
            .map(KvmStats::try_clone)
            .collect::<Result<Vec<_>, _>>()
            .unwrap_or_default();
        let halt_poll = HaltPollControl::new(vm.fd.clone(), governor_stats, vm.guest_poll_areas());
        let mut r = Running {
            vm,
            vcpus: Vec::new(),
            state: Lifecycle::Created,
            stashed: VecDeque::new(),
            halt_poll,
            postcopy_left: None,
        };
        if let HaltPoll::Auto { budget_pct } = r.vm.config().halt_poll {
            r.halt_poll.start_governor(budget_pct).map_err(|e| {
                let why = match e {
                    HaltPollError::Host(why) | HaltPollError::Invalid { reason: why, .. } => why,
                };
                Error::Host {
                    what: "start the halt-poll governor",
                    source: std::io::Error::other(why),
                }
            })?;
        }
        Ok(r)
    }

    fn spawn_vcpus(&mut self) -> Result<(), Error> {
        for vcpu in self.vm.vcpus.drain(..) {
            let tx = std::sync::Mutex::new(self.vm.events.tx.clone());
            let index = vcpu.index() as usize;
            let sink = Box::new(move |e: VcpuEvent| {
                let _ = tx.locked().send(VmEvent::Vcpu(e));
            });
            // An arriving VM's vCPUs wait for its state.
            let paused = self.vm.hosting.start_paused || self.vm.arrival.arriving.is_some();
            let h = VcpuHandle::spawn(vcpu, self.vm.devices.bus.clone(), paused, sink).map_err(
                |source| Error::Host {
                    what: "start a vCPU thread",
                    source,
                },
            )?;
            debug_assert_eq!(h.index(), index);
            self.vcpus.push(h);
        }
        Ok(())
    }

    /// Kickers of the vCPU threads (for the migration's throttle ticker,
    /// which ends before the threads are joined).
    pub(super) fn kickers(&self) -> Vec<Kicker> {
        self.vcpus.iter().filter_map(VcpuHandle::kicker).collect()
    }

    pub(super) fn set_state(&mut self, state: Lifecycle, started: Option<Instant>) {
        self.state = state;
        let mut s = self.vm.status.locked();
        s.state = state;
        if started.is_some() {
            s.started = started;
        }
    }

    /// The control loop: until a vCPU ends the run or a command does.
    fn serve(&mut self) -> Result<End, Error> {
        loop {
            let event = match self.stashed.pop_front() {
                Some(e) => e,
                None => self
                    .vm
                    .events
                    .rx
                    .recv()
                    .expect("the Vm holds a sender, so the channel stays open"),
            };
            match event {
                VmEvent::Vcpu(VcpuEvent::Exit { vcpu, code }) => {
                    return Ok(End::PowerOff { vcpu, code })
                }
                VmEvent::Vcpu(VcpuEvent::Reboot { vcpu }) => return Ok(End::Reboot { vcpu }),
                VmEvent::Vcpu(VcpuEvent::Crash(c)) => return Ok(End::Crash(c)),
                VmEvent::Vcpu(VcpuEvent::Failed { error, .. }) => return Ok(End::Failed(error)),
                VmEvent::Vcpu(VcpuEvent::Panicked { vcpu }) => return Ok(End::VcpuGone(vcpu)),
                VmEvent::PagerFailed(msg) => return Ok(End::Pager(msg)),
                VmEvent::PostcopyArrived => self.vm.postcopy_arrived(),
                VmEvent::PrefetchLoaded => {
                    if let Err(e) = self.vm.release_loaded_pager() {
                        return Ok(End::Pager(format!(
                            "releasing guest memory after the prefetch: {e}"
                        )));
                    }
                }
                VmEvent::Command(cmd, reply) => {
                    let (result, end) = self.command(cmd);
                    let _ = reply.send(result);
                    if let Some(end) = end {
                        return Ok(end);
                    }
                }
            }
        }
    }

    fn command(&mut self, cmd: Command) -> (Result<Reply, CommandError>, Option<End>) {
        let state = |s: Lifecycle| Reply::State { state: s };
        match cmd {
            Command::Pause => (
                self.pause().map(|d| Reply::Paused {
                    pause_us: d.as_micros() as u64,
                }),
                None,
            ),
            Command::Resume => (self.resume().map(|_| state(self.state)), None),
            Command::Shutdown => (Ok(state(Lifecycle::Exited)), Some(End::Shutdown)),
            Command::Signal(s) => (Ok(state(Lifecycle::Exited)), Some(End::Signal(s))),
            Command::Snapshot {
                path,
                stop,
                hot_window,
                also_at,
            } => match self.snapshot(&path, stop, hot_window, also_at.as_deref()) {
                Ok(info) => {
                    let end = info.stopped.then_some(End::Snapshot);
                    (Ok(Reply::Snapshot(info)), end)
                }
                Err(e) => (Err(e), None),
            },
            Command::Migrate(o) => {
                // Under way from here (connecting included): other commands
                // are answered at once instead of waiting behind it.
                self.progress(Some(super::control::MigrationProgress {
                    mode: o.mode,
                    ..Default::default()
                }));
                let migrated = self.migrate(&o);
                self.progress(None);
                match migrated {
                    Ok(report) => (Ok(Reply::Migrated(Box::new(report))), Some(End::Migrated)),
                    Err(e) => (Err(e), None),
                }
            }
            Command::Boost(u) => (self.set_boost(&u), None),
            Command::DirtyLog(r) => (self.dirty_log(&r).map(Reply::DirtyLog), None),
            Command::HaltPoll(h) => (
                self.set_halt_poll(h).map(|_| Reply::HaltPoll {
                    halt_poll: h.to_json(),
                }),
                None,
            ),
        }
    }

    /// Tell every vCPU `msg` at once, then collect every reply.
    pub(super) fn broadcast(
        &self,
        msg: impl Fn() -> VcpuMsg,
    ) -> Result<Vec<VcpuReply>, CommandError> {
        for h in &self.vcpus {
            h.send(msg());
        }
        self.vcpus
            .iter()
            .map(|h| {
                h.reply().ok_or_else(|| {
                    CommandError::Host(format!("the thread of vCPU {} has ended", h.index()))
                })
            })
            .collect()
    }

    pub(super) fn wrong_state(&self, action: &'static str, needs: &'static str) -> CommandError {
        CommandError::WrongState {
            state: self.state,
            action,
            needs,
        }
    }

    pub(super) fn pause(&mut self) -> Result<Duration, CommandError> {
        if self.state != Lifecycle::Running {
            return Err(self.wrong_state("pause", "running"));
        }
        let t0 = Instant::now();
        self.broadcast(|| VcpuMsg::Pause)?;
        let took = t0.elapsed();
        self.vm.devices.pause();
        self.vm.booster.pause();
        self.set_state(Lifecycle::Paused, None);
        Ok(took)
    }

    pub(super) fn resume(&mut self) -> Result<(), CommandError> {
        if self.state != Lifecycle::Paused {
            return Err(self.wrong_state("resume", "paused"));
        }
        self.vm.devices.resume();
        self.vm.booster.resume();
        self.broadcast(|| VcpuMsg::Resume)?;
        self.set_state(Lifecycle::Running, None);
        Ok(())
    }

    fn set_boost(&mut self, u: &BoostUpdate) -> Result<Reply, CommandError> {
        let (config, boost) = self.vm.booster.update(u).map_err(|e| match e {
            UpdateError::Invalid { field, reason } => CommandError::Invalid { field, reason },
            e @ UpdateError::Monitor(_) => CommandError::Host(e.to_string()),
        })?;
        self.vm.change_config(|c| c.boost = config);
        self.vm.status.locked().boost_tuning = self.vm.booster.tuning();
        Ok(Reply::Boost { boost })
    }

    fn set_halt_poll(&mut self, h: HaltPoll) -> Result<(), CommandError> {
        self.halt_poll.set(h).map_err(|e| match e {
            HaltPollError::Invalid { field, reason } => CommandError::Invalid { field, reason },
            HaltPollError::Host(e) => CommandError::Host(e),
        })?;
        self.vm.change_config(|c| c.halt_poll = h);
        Ok(())
    }

    /// Where the API reads live figures from.
    fn live_sources(&self, started: Instant) -> LiveSources {
        let vcpu_stats = self
            .vm
            .kvm_stats
            .vcpus
            .iter()
            .map(KvmStats::try_clone)
            .collect::<Result<Vec<_>, _>>();
        LiveSources {
            vcpu_stats: vcpu_stats.unwrap_or_default(),
            vm_stats: KvmStats::open(self.vm.fd.as_ref()).ok(),
            pager: self
                .vm
                .paging
                .pager()
                .map(|p| Box::new(p.stats_source()) as Box<dyn Fn() -> PagerStats + Send + Sync>),
            governor: self.halt_poll.live(),
            boost: Some(self.vm.booster.clone()),
            io: self.vm.devices.pvio.clone(),
            guest_poll: self.vm.guest_poll_areas().map(|mem| {
                let n = self.vm.config().vcpus;
                let warned = std::sync::atomic::AtomicBool::new(false);
                Box::new(move || crate::sched::guest_poll::read(&mem, n, &warned))
                    as Box<dyn Fn() -> _ + Send + Sync>
            }),
            balloon: self.vm.devices.balloon_handle(),
            started,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Whatever went wrong, no vCPU thread outlives the VM.
        for h in self.vcpus.drain(..) {
            let _ = h.stop();
        }
    }
}
