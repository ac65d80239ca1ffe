//! The API socket: live figures of a running VM, for `hover stats`.
//!
//! `hover run --api-socket PATH` listens on a Unix socket. A client sends one
//! line, `stats`, and reads one line back: a JSON [`LiveStats`] document (or
//! `{"error": "..."}` for anything else), then the connection closes. The
//! socket file is created by the server (an existing path is refused, never
//! replaced) and removed when the VM stops.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::devices::pvio::{PvioDevice, PvioStats};
use crate::memory::paged::PagerStats;
use crate::sched::halt_poll::GovernorReport;
use crate::stats::KvmStats;

/// Longest request line accepted.
const MAX_REQUEST: usize = 256;

/// Why the API socket failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The path exists already.
    #[error("--api-socket {}: already exists; give a new path (a stale socket from a stopped VM can be removed)", .0.display())]
    Exists(PathBuf),
    /// Binding failed.
    #[error("--api-socket {}: cannot listen there: {source}", .path.display())]
    Bind {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Connecting failed.
    #[error("cannot reach a VM at {}: {source} (is `hover run --api-socket` running there?)", .path.display())]
    Connect {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The VM's answer could not be read or was an error.
    #[error("the VM at {} answered badly: {reason}", .path.display())]
    BadReply {
        /// The path.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
}

/// Where live figures come from.
pub struct LiveSources {
    /// One stats fd per vCPU.
    pub vcpu_stats: Vec<KvmStats>,
    /// The VM's stats fd.
    pub vm_stats: Option<KvmStats>,
    /// The pager's counters, if paging.
    pub pager: Option<Box<dyn Fn() -> PagerStats + Send + Sync>>,
    /// The governor's report, if governing.
    pub governor: Option<Box<dyn Fn() -> GovernorReport + Send + Sync>>,
    /// The I/O device.
    pub io: Arc<PvioDevice>,
    /// When the vCPUs started.
    pub started: Instant,
}

/// The answer to `stats`.
#[derive(Serialize)]
pub struct LiveStats {
    /// Milliseconds since the vCPUs started.
    pub uptime_ms: u64,
    /// KVM's single-valued statistics of each vCPU.
    pub vcpu_stats: Vec<BTreeMap<String, u64>>,
    /// KVM's histograms of each vCPU.
    pub vcpu_histograms: Vec<BTreeMap<String, Vec<u64>>>,
    /// KVM's statistics of the VM.
    pub vm_stats: BTreeMap<String, u64>,
    /// The pager, if paging.
    pub pager: Option<PagerStats>,
    /// The halt-poll governor, if governing.
    pub halt_poll: Option<GovernorReport>,
    /// The I/O device, once the guest has set it up.
    pub io: Option<PvioStats>,
}

impl LiveSources {
    fn snapshot(&self) -> LiveStats {
        let snaps: Vec<_> = self
            .vcpu_stats
            .iter()
            .filter_map(|s| s.read().ok())
            .collect();
        LiveStats {
            uptime_ms: self.started.elapsed().as_millis() as u64,
            vcpu_stats: snaps.iter().map(|s| s.scalars()).collect(),
            vcpu_histograms: snaps.iter().map(|s| s.histograms()).collect(),
            vm_stats: self
                .vm_stats
                .as_ref()
                .and_then(|s| s.read().ok())
                .map(|s| s.scalars())
                .unwrap_or_default(),
            pager: self.pager.as_ref().map(|f| f()),
            halt_poll: self.governor.as_ref().map(|f| f()),
            io: self.io.stats(),
        }
    }
}

/// The listening socket and its thread.
pub struct ApiServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn answer(stream: UnixStream, sources: &LiveSources) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut line = String::new();
    let mut reader = BufReader::new(&stream).take(MAX_REQUEST as u64);
    let reply = match reader.read_line(&mut line) {
        Ok(_) if line.trim() == "stats" => serde_json::to_string(&sources.snapshot()).unwrap_or_else(|e| {
            serde_json::json!({ "error": format!("cannot encode the figures: {e}") }).to_string()
        }),
        Ok(_) => serde_json::json!({ "error": format!("unknown request {:?}: the only request is \"stats\"", line.trim()) }).to_string(),
        Err(e) => serde_json::json!({ "error": format!("cannot read the request: {e}") }).to_string(),
    };
    let mut w = &stream;
    let _ = w
        .write_all(reply.as_bytes())
        .and_then(|_| w.write_all(b"\n"));
}

impl ApiServer {
    /// Listen at `path` and serve `sources` until stopped.
    pub fn start(path: &Path, sources: LiveSources) -> Result<ApiServer, ApiError> {
        if path.symlink_metadata().is_ok() {
            return Err(ApiError::Exists(path.into()));
        }
        let listener = UnixListener::bind(path).map_err(|source| ApiError::Bind {
            path: path.into(),
            source,
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("api".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if stop2.load(Ordering::Acquire) {
                        return;
                    }
                    if let Ok(s) = stream {
                        answer(s, &sources);
                    }
                }
            })
            .map_err(|source| ApiError::Bind {
                path: path.into(),
                source,
            })?;
        Ok(ApiServer {
            path: path.into(),
            stop,
            thread: Some(thread),
        })
    }

    /// Stop serving and remove the socket.
    pub fn stop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop.store(true, Ordering::Release);
            // Wake the accept loop.
            let _ = UnixStream::connect(&self.path);
            let _ = t.join();
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Ask the VM at `path` for its live figures (the JSON document).
pub fn query(path: &Path) -> Result<serde_json::Value, ApiError> {
    let bad = |reason: String| ApiError::BadReply {
        path: path.into(),
        reason,
    };
    let mut s = UnixStream::connect(path).map_err(|source| ApiError::Connect {
        path: path.into(),
        source,
    })?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    s.write_all(b"stats\n").map_err(|e| bad(e.to_string()))?;
    let mut line = String::new();
    BufReader::new(&s)
        .read_line(&mut line)
        .map_err(|e| bad(e.to_string()))?;
    let v: serde_json::Value = serde_json::from_str(&line).map_err(|e| bad(e.to_string()))?;
    if let Some(e) = v.get("error") {
        return Err(bad(e.to_string()));
    }
    Ok(v)
}
