//! Saving a running VM: a snapshot file (its state and memory, pausing
//! meanwhile), and the state document a snapshot and a migration carry.

use std::time::{Duration, Instant};

use super::control::{CommandError, Lifecycle, SnapshotInfo};
use super::persist::{Clock, Irqchips, Persist, Pit};
use super::run::Running;
use crate::state::file::SnapshotWriter;
use crate::state::{self, MachineState, VmState};
use crate::vcpu::thread::{VcpuMsg, VcpuReply};

impl Running {
    pub(super) fn snapshot(
        &mut self,
        path: &std::path::Path,
        stop: bool,
        hot_window: Duration,
        also_at: Option<&std::path::Path>,
    ) -> Result<SnapshotInfo, CommandError> {
        if !matches!(self.state, Lifecycle::Running | Lifecycle::Paused) {
            return Err(self.wrong_state("snapshot", "running or paused"));
        }
        let also_at = match also_at {
            Some(also) => second_name(path, also)?,
            None => None,
        };
        let mut w = SnapshotWriter::create(path)?;
        let hot = match self.record_hot_set(hot_window) {
            Ok(h) => h,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
        };
        let hot_pages = hot.len() as u64;
        w.hot_set(hot);
        let was_running = self.state == Lifecycle::Running;
        let pause = if was_running {
            match self.pause() {
                Ok(d) => d,
                Err(e) => {
                    let _ = std::fs::remove_file(path);
                    return Err(e);
                }
            }
        } else {
            Duration::ZERO
        };
        let t0 = Instant::now();
        let written = self.save(&mut w).and_then(|(state, pages)| {
            let bytes = w.finish(&state)?;
            Ok((bytes, pages))
        });
        let paused_us = (pause + t0.elapsed()).as_micros() as u64;
        let written = written.and_then(|w| match &also_at {
            Some(also) => std::fs::hard_link(path, also).map(|()| w).map_err(|source| {
                state::file::SnapshotError::Io {
                    path: also.into(),
                    what: "cannot give the snapshot this second name (a hard link: it must be on the snapshot's filesystem)",
                    source,
                }
                .into()
            }),
            None => Ok(w),
        });
        let result = match written {
            Ok((bytes, pages)) => Ok(SnapshotInfo {
                path: path.display().to_string(),
                bytes,
                pages,
                pause_us: pause.as_micros() as u64,
                paused_us,
                stopped: stop,
                hot_pages,
            }),
            Err(e) => {
                // Never leave a partial snapshot that looks like one.
                let _ = std::fs::remove_file(path);
                Err(e)
            }
        };
        if was_running && !(stop && result.is_ok()) {
            if let Err(e) = self.resume() {
                tracing::error!("cannot resume the VM after a snapshot: {e}");
            }
        }
        result
    }

    /// Save everything but memory into a state document, and memory into `w`.
    fn save(&self, w: &mut SnapshotWriter) -> Result<(VmState, u64), CommandError> {
        let state = self.collect_state()?;
        let pages = state::memory::save(&self.vm.ram, self.vm.paging.pager(), w)?;
        Ok((state, pages))
    }

    /// What the VM is now, as saved and sent: its one live configuration
    /// ([`Vm::config`]: what it was built from, each disk's size as it
    /// opened, what changed live) and where its image ends.
    pub(super) fn saved_machine(&self) -> crate::state::SavedMachine {
        crate::state::SavedMachine {
            config: self.vm.config(),
            image_end: self.vm.image_end,
        }
    }

    /// Everything but memory, as a state document (the VM is paused).
    pub(super) fn collect_state(&self) -> Result<VmState, CommandError> {
        let mut vcpus = Vec::with_capacity(self.vcpus.len());
        for (i, reply) in self.broadcast(|| VcpuMsg::Save)?.into_iter().enumerate() {
            match reply {
                VcpuReply::Saved(Ok(s)) => vcpus.push(*s),
                VcpuReply::Saved(Err(e)) => {
                    return Err(CommandError::Host(format!("cannot save vCPU {i}: {e}")))
                }
                _ => return Err(CommandError::Host(format!("vCPU {i} answered out of turn"))),
            }
        }
        Ok(VmState {
            config: self.saved_machine(),
            vcpus,
            machine: MachineState {
                irqchip: Irqchips(&self.vm.fd).save()?,
                clock: Clock(&self.vm.fd).save()?,
                host_tsc: state::host_tsc(),
                pit: match self.vm.config().guest.is_linux() {
                    true => Some(Pit(&self.vm.fd).save()?),
                    false => None,
                },
            },
            devices: self.vm.devices.save()?,
        })
    }
}

/// Check `also` as a second name for a snapshot about to be written at
/// `path`, before a byte is written: `None` if it names the same file
/// (another spelling of `path`), an error if it exists or lies on another
/// filesystem (a hard link cannot cross one).
fn second_name(
    path: &std::path::Path,
    also: &std::path::Path,
) -> Result<Option<std::path::PathBuf>, CommandError> {
    use state::file::SnapshotError;
    use std::os::unix::fs::MetadataExt;
    let dir = |p: &std::path::Path| {
        let d = p.parent().filter(|d| !d.as_os_str().is_empty());
        std::fs::canonicalize(d.unwrap_or(std::path::Path::new(".")))
    };
    let io = |p: &std::path::Path, what, source| SnapshotError::Io {
        path: p.into(),
        what,
        source,
    };
    let (d1, d2) = (
        dir(path).map_err(|e| io(path, "its directory", e))?,
        dir(also).map_err(|e| io(also, "its directory", e))?,
    );
    if d1 == d2 && path.file_name() == also.file_name() {
        return Ok(None);
    }
    if also.symlink_metadata().is_ok() {
        return Err(SnapshotError::Exists(also.into()).into());
    }
    let dev = |d: &std::path::Path| std::fs::metadata(d).map(|m| m.dev());
    if dev(&d1).ok() != dev(&d2).ok() {
        return Err(io(
            also,
            "cannot be a second name of the snapshot: Hover keeps state and memory in one file and links it under both names, so both must be on one filesystem",
            std::io::Error::from_raw_os_error(libc::EXDEV),
        )
        .into());
    }
    Ok(Some(also.into()))
}
