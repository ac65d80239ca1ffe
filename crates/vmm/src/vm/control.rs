//! Steering a running VM: the commands its control loop takes, and the
//! [`Controller`] that sends them (the API server, tests, the migration
//! engine). Commands are carried out one at a time by the VM's own loop,
//! between vCPU events, so they never race each other or the guest's end.

use crate::sync::Locked;
use std::path::PathBuf;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::HaltPoll;
use crate::state::file::SnapshotError;
use crate::vcpu::thread::RunState;
use crate::vcpu::VcpuEvent;

/// A command to a running VM.
#[derive(Debug)]
pub enum Command {
    /// Stop every vCPU and freeze the devices.
    Pause,
    /// Undo a pause.
    Resume,
    /// End the run (the guest does not get to power off).
    Shutdown,
    /// End the run because the VMM was sent this signal (SIGTERM, SIGINT;
    /// [`crate::signals`]).
    Signal(i32),
    /// Save state and memory to a new file, pausing meanwhile; then resume,
    /// or end the run if `stop`.
    Snapshot {
        /// The file to create.
        path: PathBuf,
        /// End the run once the snapshot is written.
        stop: bool,
        /// Watch what the guest writes for this long before pausing: the
        /// hot set a prefetching restore loads first.
        hot_window: std::time::Duration,
        /// A second name for the file (a hard link, made once it is
        /// complete): Firecracker's API names a memory file beside the
        /// state, and Hover keeps both in one file.
        also_at: Option<PathBuf>,
    },
    /// Change halt polling.
    HaltPoll(HaltPoll),
    /// Change vCPU priority boosting.
    Boost(crate::config::BoostUpdate),
    /// Move the running VM to another host (`hover receive` there).
    Migrate(crate::migration::MigrateOptions),
    /// Track dirty pages for a while without sending any (seed 4's
    /// experiment).
    DirtyLog(crate::migration::dirty::DirtyLogRequest),
}

impl Command {
    /// What the command asks, for messages.
    pub fn action(&self) -> &'static str {
        match self {
            Command::Pause => "pause",
            Command::Resume => "resume",
            Command::Shutdown => "shutdown",
            Command::Signal(_) => "a signal's shutdown",
            Command::Snapshot { .. } => "a snapshot",
            Command::HaltPoll(_) => "a halt-polling change",
            Command::Boost(_) => "a boosting change",
            Command::Migrate(_) => "another migration",
            Command::DirtyLog(_) => "dirty logging",
        }
    }
}

/// What a command did.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Reply {
    /// Paused: how long it took until every vCPU had stopped.
    Paused {
        /// Microseconds from the command to the last vCPU stopped.
        pause_us: u64,
    },
    /// The state the VM is in now.
    State {
        /// `running`, `paused` or `exited`.
        state: Lifecycle,
    },
    /// A snapshot was written.
    Snapshot(SnapshotInfo),
    /// The VM moved; the run ends.
    Migrated(Box<crate::migration::MigrationReport>),
    /// Halt polling as now set, in the request's form ([`HaltPoll::to_json`]).
    HaltPoll {
        /// The setting.
        halt_poll: serde_json::Value,
    },
    /// Boosting as now set ([`crate::config::BoostConfig::to_json`]).
    Boost {
        /// The settings.
        boost: serde_json::Value,
    },
    /// What dirty tracking did.
    DirtyLog(crate::migration::dirty::DirtyLogReport),
}

/// A snapshot, once written.
#[derive(Clone, Debug, Serialize)]
pub struct SnapshotInfo {
    /// The file.
    pub path: String,
    /// Its size, bytes.
    pub bytes: u64,
    /// Guest pages it holds.
    pub pages: u64,
    /// Microseconds to stop the vCPUs (0 if the VM was paused already).
    pub pause_us: u64,
    /// Microseconds the VM was paused for the snapshot (state and memory).
    pub paused_us: u64,
    /// Whether the VM ended with it.
    pub stopped: bool,
    /// Pages in its hot set (section `HOTS`).
    pub hot_pages: u64,
}

/// Why a command failed. The VM is as it was before the command.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The command does not fit the VM's state (resume a running VM).
    #[error("the VM is {}: {action} needs a {needs} VM", state.name())]
    WrongState {
        /// The VM's state.
        state: Lifecycle,
        /// What was asked.
        action: &'static str,
        /// The state it needs.
        needs: &'static str,
    },
    /// A value is out of range.
    #[error("{field}: {reason}")]
    Invalid {
        /// The request field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The snapshot could not be written (the file is removed; the VM runs on).
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// A migration failed (the VM runs on here).
    #[error("migration failed, the VM runs on here: {0}")]
    Migration(#[from] crate::migration::MigrationError),
    /// A live migration is under way: the VM takes no other command
    /// until it ends.
    #[error("a live migration is under way ({0}): {action} can be asked once it ends (GET /vm shows its progress)", action = .1)]
    Migrating(String, &'static str),
    /// The VM has ended.
    #[error("the VM has stopped")]
    Gone,
    /// A host-side failure.
    #[error("{0}")]
    Host(String),
    /// KVM or the host failed while the VM was asked to act.
    #[error(transparent)]
    Vm(#[from] crate::Error),
}

/// The VM's state as the API shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Lifecycle {
    /// The vCPUs have not started yet.
    Created,
    /// The guest runs.
    Running,
    /// Every vCPU is stopped and the devices frozen.
    Paused,
    /// A post-copy source whose connection broke: the destination's guest
    /// has run, so this one never resumes; it keeps the pages the
    /// destination still lacks until a recovery (`recover`) or shutdown.
    PostcopyPaused,
    /// The run has ended.
    Exited,
}

impl Lifecycle {
    /// The state's name, as the API spells it.
    pub fn name(self) -> &'static str {
        match self {
            Lifecycle::Created => "created",
            Lifecycle::Running => "running",
            Lifecycle::Paused => "paused",
            Lifecycle::PostcopyPaused => "postcopy-paused",
            Lifecycle::Exited => "exited",
        }
    }
}

impl From<RunState> for Lifecycle {
    fn from(s: RunState) -> Self {
        match s {
            RunState::Running => Lifecycle::Running,
            RunState::Paused => Lifecycle::Paused,
            RunState::Exited => Lifecycle::Exited,
        }
    }
}

/// How a live migration is going, for `GET /vm` (and `hover ctl migrate`'s
/// progress line).
#[derive(Clone, Debug, Default, Serialize)]
pub struct MigrationProgress {
    /// How memory moves.
    pub mode: crate::migration::postcopy::Mode,
    /// In post-copy: pages the destination still lacks.
    pub postcopy_pages_left: Option<u64>,
    /// Rounds done.
    pub round: u32,
    /// Pages sent so far.
    pub pages_sent: u64,
    /// Pages dirty now, still to send.
    pub dirty_pages: u64,
    /// The link's measured rate, MB/s.
    pub rate_mb_s: f64,
    /// What the final round would take now, milliseconds.
    pub expected_downtime_ms: f64,
    /// Since the migration began, milliseconds.
    pub elapsed_ms: u64,
    /// Each vCPU's throttle now, percent (0: running freely).
    pub vcpu_throttle_pct: Vec<u8>,
}

/// What a VM is, for `GET /vm`.
#[derive(Clone, Debug, Serialize)]
pub struct VmInfo {
    /// Its state.
    pub state: Lifecycle,
    /// Milliseconds since the vCPUs started.
    pub uptime_ms: u64,
    /// What it was built from, with live changes.
    pub config: ShownConfig,
    /// The snapshot it was restored from, if any.
    pub restored_from: Option<String>,
    /// A live migration under way, if any.
    pub migration: Option<MigrationProgress>,
    /// A Linux guest's virtio devices, in bus order (absent when none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceInfo>,
}

/// A VM's configuration as `GET /vm` shows it: the machine's, with
/// boosting in the shape `PUT /vm/boost` takes (this host's tuning beside
/// the VM's setting; the machine's own `boost` holds only what is saved
/// with the VM).
#[derive(Clone, Debug)]
pub struct ShownConfig {
    /// The machine.
    pub machine: crate::config::MachineConfig,
    /// This host's boost tuning.
    pub boost_tuning: crate::config::boost::BoostTuning,
}

impl Serialize for ShownConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut v = serde_json::to_value(&self.machine).map_err(serde::ser::Error::custom)?;
        v["boost"] = self.machine.boost.with_tuning(&self.boost_tuning);
        v.serialize(s)
    }
}

/// One virtio device, for `GET /vm`.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceInfo {
    /// `block`, `net` or `rng`.
    pub kind: &'static str,
    /// A disk's id, a network card's MAC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Whether a disk is read-only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readonly: Option<bool>,
    /// Its MMIO window's first address.
    pub mmio_base: u64,
    /// Its IOAPIC pin.
    pub gsi: u32,
}

/// The virtio devices of `m`, in bus order.
fn device_info(m: &crate::config::MachineConfig) -> Vec<DeviceInfo> {
    use crate::devices::virtio;
    if virtio::device_count(m) == 0 {
        return Vec::new();
    }
    let disks = m
        .disks
        .iter()
        .map(|d| ("block", Some(d.id.clone()), Some(d.readonly)));
    let nets = m.nets.iter().map(|n| {
        let mac: Vec<String> = n.mac.iter().map(|b| format!("{b:02x}")).collect();
        ("net", Some(mac.join(":")), None)
    });
    let rng = m.rng.then_some(("rng", None, None));
    let balloon = m.balloon.as_ref().map(|_| ("balloon", None, None));
    disks
        .chain(nets)
        .chain(rng)
        .chain(balloon)
        .enumerate()
        .map(|(i, (kind, id, readonly))| DeviceInfo {
            kind,
            id,
            readonly,
            mmio_base: virtio::window(i),
            gsi: virtio::gsi(i),
        })
        .collect()
}

/// The VM's status, shared with readers that must not wait for its loop.
pub(crate) struct Status {
    pub(crate) state: Lifecycle,
    pub(crate) started: Option<Instant>,
    pub(crate) config: crate::config::MachineConfig,
    /// This host's boost tuning now (`--boost-when`, `--boost-keep-us`,
    /// `--boost-irq-us`, changed by `PUT /vm/boost`), for `GET /vm`.
    pub(crate) boost_tuning: crate::config::boost::BoostTuning,
    pub(crate) restored_from: Option<String>,
    pub(crate) migration: Option<MigrationProgress>,
    /// Set by `PUT /vm/migrate/postcopy`: a hybrid migration switches to
    /// post-copy after its current round.
    pub(crate) postcopy_now: bool,
    /// An arriving migration's connection until it commits (RUNNING): a
    /// signal shuts its reading side, so that the wait for the stream's
    /// next frame ends at once (the refusal can still be written). Taken
    /// away under this lock just before RUNNING, so a signal either cuts
    /// the stream before it or comes too late to touch the link.
    pub(crate) hangup: Option<crate::migration::transport::Conn>,
}

/// What the VM's control loop hears.
pub(crate) enum VmEvent {
    Vcpu(VcpuEvent),
    PagerFailed(String),
    /// A prefetching restore's loader has placed every page it was given.
    PrefetchLoaded,
    /// Every page of a post-copy has arrived.
    PostcopyArrived,
    Command(Command, Sender<Result<Reply, CommandError>>),
}

/// Sends commands to a VM and reads its status; cheap to clone.
#[derive(Clone)]
pub struct Controller {
    pub(crate) tx: Sender<VmEvent>,
    pub(crate) status: Arc<Mutex<Status>>,
}

impl Controller {
    /// Carry out `cmd` and wait for its result. Commands wait for the one
    /// before them, so this can take as long as a snapshot; `timeout` bounds it.
    pub fn request(&self, cmd: Command, timeout: Duration) -> Result<Reply, CommandError> {
        // The VM's loop runs a migration: a command sent now would wait
        // for all of it, then find a VM that may be gone.
        if let Some(m) = &self.status.locked().migration {
            let how = if m.round == 0 && m.pages_sent == 0 {
                "connecting".to_string()
            } else {
                format!("round {}, {} pages sent", m.round, m.pages_sent)
            };
            return Err(CommandError::Migrating(how, cmd.action()));
        }
        let (tx, rx) = mpsc::channel();
        self.tx
            .send(VmEvent::Command(cmd, tx))
            .map_err(|_| CommandError::Gone)?;
        // A command that arrives as the VM ends is never carried out: its
        // loop answers the commands it takes before it says `exited`, so
        // from then on no answer is coming.
        let until = std::time::Instant::now() + timeout;
        loop {
            let left = until.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left.min(Duration::from_millis(20))) {
                Ok(r) => return r,
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(CommandError::Gone),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let state = self.status.locked().state;
                    if state == Lifecycle::Exited {
                        return rx.try_recv().unwrap_or(Err(CommandError::Gone));
                    }
                    if left.is_zero() {
                        return Err(CommandError::Host(format!(
                            "the VM did not answer within {}; the command may still complete",
                            crate::config::duration_text(timeout)
                        )));
                    }
                }
            }
        }
    }

    /// Send `cmd` without waiting for its result (a console's Ctrl-A x:
    /// the VM's loop may be busy with a command before it).
    pub fn send(&self, cmd: Command) {
        let (tx, _) = mpsc::channel();
        let _ = self.tx.send(VmEvent::Command(cmd, tx));
    }

    /// End the run for `signal`, without waiting (the signal watcher must
    /// not block). A command under way (a migration) finishes first: a
    /// post-copy destination still needs this VM's pages.
    pub fn signal(&self, signal: i32) {
        let (tx, _) = mpsc::channel();
        let _ = self.tx.send(VmEvent::Command(Command::Signal(signal), tx));
        let hangup = self.status.locked().hangup.take();
        if let Some(conn) = hangup {
            conn.shutdown_read();
        }
    }

    /// Have the hybrid migration under way switch to post-copy after its
    /// current round (without waiting for the VM's loop, which runs it).
    pub fn switch_to_postcopy(&self) -> Result<(), CommandError> {
        let mut s = self.status.locked();
        match &s.migration {
            Some(m) if m.mode == crate::migration::postcopy::Mode::Hybrid => {
                s.postcopy_now = true;
                Ok(())
            }
            Some(_) => Err(CommandError::Invalid {
                field: "mode",
                reason: "only a hybrid migration switches to post-copy (start it with mode hybrid)"
                    .into(),
            }),
            None => Err(CommandError::WrongState {
                state: s.state,
                action: "switch to post-copy",
                needs: "migrating (hybrid)",
            }),
        }
    }

    /// The VM's state and configuration, without waiting for its loop.
    pub fn info(&self) -> VmInfo {
        let s = self.status.locked();
        VmInfo {
            state: s.state,
            uptime_ms: s.started.map_or(0, |t| t.elapsed().as_millis() as u64),
            config: ShownConfig {
                machine: s.config.clone(),
                boost_tuning: s.boost_tuning,
            },
            restored_from: s.restored_from.clone(),
            migration: s.migration.clone(),
            devices: device_info(&s.config),
        }
    }
}
