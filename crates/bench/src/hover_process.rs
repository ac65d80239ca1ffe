//! Running `hover run --json` as a fresh process, as a user would, and
//! reading its outcome.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::BenchError;

/// One finished `hover run`.
pub struct Run {
    /// When the process was started.
    pub started: Instant,
    /// When the first byte of the guest console (on stderr) arrived.
    pub first_console_byte: Option<Instant>,
    /// When the process had exited.
    pub exited: Instant,
    /// The outcome JSON `hover run --json` printed.
    pub outcome: Value,
}

impl Run {
    /// A number in the outcome at `path` (e.g. `["timings", "setup_us"]`).
    pub fn number(&self, path: &[&str]) -> Result<f64, BenchError> {
        path.iter()
            .fold(&self.outcome, |v, k| &v[*k])
            .as_f64()
            .ok_or_else(|| BenchError::Guest(format!("hover run --json lacks {}", path.join("."))))
    }

    /// KVM statistic `stat` summed over the vCPUs (0 where absent).
    pub fn vcpu_stat(&self, stat: &str) -> u64 {
        sum_stat(&self.outcome["vcpu_stats"], stat)
    }

    /// The guest's report `key` (the first one, from any vCPU).
    pub fn report(&self, key: &str) -> Result<f64, BenchError> {
        self.outcome["reports"]
            .as_array()
            .and_then(|rs| rs.iter().find(|r| r["key"] == key))
            .and_then(|r| r["value"].as_f64())
            .ok_or_else(|| BenchError::Guest(format!("the guest did not report {key}")))
    }
}

/// Run `exe run --json --console stderr` with `args`; the guest must exit 0.
pub fn run_hover(exe: &Path, args: &[&str]) -> Result<Run, BenchError> {
    let err = |m: String| BenchError::Guest(m);
    let started = Instant::now();
    let mut child = dies_with_bench(
        Command::new(exe)
            .args(["run", "--json", "--console", "stderr"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .spawn()
    .map_err(|e| err(format!("cannot start {}: {e}", exe.display())))?;
    let mut stderr = child.stderr.take().expect("stderr is piped");
    let console = thread::spawn(move || {
        let mut first = [0u8; 1];
        let at = stderr.read_exact(&mut first).ok().map(|_| Instant::now());
        let mut rest = Vec::new();
        let _ = stderr.read_to_end(&mut rest);
        (
            at,
            String::from_utf8_lossy(&first).into_owned() + &String::from_utf8_lossy(&rest),
        )
    });
    let mut stdout = String::new();
    let _ = child
        .stdout
        .take()
        .expect("stdout is piped")
        .read_to_string(&mut stdout);
    let status = child
        .wait()
        .map_err(|e| err(format!("waiting for hover run: {e}")))?;
    let exited = Instant::now();
    let (first_console_byte, text) = console.join().unwrap_or((None, String::new()));
    if !status.success() {
        // Its own words, as it printed them: the last lines of its stderr
        // (the guest's console comes first there, Hover's error last).
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(8)..].join("\n");
        return Err(err(format!(
            "hover run {} exited with {status}; the end of its output:\n{tail}",
            args.join(" "),
        )));
    }
    let outcome =
        serde_json::from_str(&stdout).map_err(|e| err(format!("hover run --json: {e}")))?;
    Ok(Run {
        started,
        first_console_byte,
        exited,
        outcome,
    })
}

/// KVM statistic `name` summed over the per-vCPU statistics `stats` (an
/// outcome's `vcpu_stats`; 0 where absent).
pub(crate) fn sum_stat(stats: &Value, name: &str) -> u64 {
    stats
        .as_array()
        .map(|v| v.iter().filter_map(|s| s[name].as_u64()).sum())
        .unwrap_or(0)
}

/// A scenario's failure with a message.
pub fn guest(m: &str) -> BenchError {
    BenchError::Guest(m.to_string())
}

/// The host TSC now (the guest's too: this host cannot offset it).
pub fn rdtsc() -> u64 {
    hover_vmm::state::host_tsc()
}

/// A `hover` process a scenario started: ended (SIGTERM, then SIGKILL
/// after [`OwnedChild::GRACE`]) and reaped if it is dropped before it was
/// waited for, so a scenario that fails part-way leaves no VM or receiver
/// running, and SIGTERM lets it remove its sockets.
pub struct OwnedChild(Option<Child>, Vec<TempPath>);

impl std::fmt::Debug for OwnedChild {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("OwnedChild").field(&self.0).finish()
    }
}

impl OwnedChild {
    /// How long a dropped child has to end on SIGTERM.
    pub const GRACE: Duration = Duration::from_secs(5);

    /// Own `child`.
    pub fn new(child: Child) -> Self {
        OwnedChild(Some(child), Vec::new())
    }

    /// `path` (a socket the child makes) removed when the child is
    /// dropped, and if a signal ends the bench.
    pub fn owning(mut self, path: &Path) -> Self {
        self.1.push(TempPath::new(path.to_path_buf()));
        self
    }

    /// The child, no longer ended on drop: whoever takes it waits for it.
    pub fn into_inner(mut self) -> Child {
        self.0
            .take()
            .expect("an OwnedChild holds its child until dropped")
    }
}

impl std::ops::Deref for OwnedChild {
    type Target = Child;
    fn deref(&self) -> &Child {
        self.0
            .as_ref()
            .expect("an OwnedChild holds its child until dropped")
    }
}

impl std::ops::DerefMut for OwnedChild {
    fn deref_mut(&mut self) -> &mut Child {
        self.0
            .as_mut()
            .expect("an OwnedChild holds its child until dropped")
    }
}

impl Drop for OwnedChild {
    fn drop(&mut self) {
        let Some(mut child) = self.0.take() else {
            return;
        };
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        // SAFETY: kill(2) on our own child, not yet reaped (so its pid is
        // still its own).
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Self::GRACE;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A file the bench makes, or has a VM make (a snapshot, a socket, an
/// I/O file): removed when dropped, and if a signal ends the bench first.
pub struct TempPath {
    path: PathBuf,
    _on_signal: hover_vmm::signals::RemoveOnSignal,
}

impl TempPath {
    /// Take charge of `path` (nothing is made here).
    pub fn new(path: PathBuf) -> Self {
        TempPath {
            _on_signal: hover_vmm::signals::remove_on_signal(path.clone()),
            path,
        }
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Have the process `cmd` starts get SIGTERM when the bench's process
/// ends, however it ends (a signal, a panic): a VM, receiver or QEMU the
/// bench started never outlives it. (The parent-death signal follows the
/// thread that spawned; every scenario spawns from the main thread, whose
/// end is the process's.)
pub fn dies_with_bench(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid before the fork; in the child only async-signal-safe
    // calls (prctl, getppid, _exit).
    let parent = unsafe { libc::getpid() };
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The bench ended between the fork and the prctl.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        })
    }
}

/// Start `cmd` (a `hover` command line), owned: see [`OwnedChild`]; it
/// also [`dies_with_bench`].
pub fn spawn_owned(cmd: &mut Command, what: &str) -> Result<OwnedChild, BenchError> {
    dies_with_bench(cmd)
        .spawn()
        .map(OwnedChild::new)
        .map_err(|e| guest(&format!("cannot start {what}: {e}")))
}

/// Wait for `child` (started with `--json`, stdout piped): its JSON outcome;
/// it must exit 0.
pub fn wait_json(child: OwnedChild, what: &str) -> Result<Value, BenchError> {
    let out = child
        .into_inner()
        .wait_with_output()
        .map_err(|e| guest(&format!("{what}: {e}")))?;
    if !out.status.success() {
        return Err(guest(&format!(
            "{what} exited with {}:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| guest(&format!("{what} --json: {e}")))
}

/// Start `exe args --api-socket sock --json --console off` and wait (up to
/// 30 s) for its API socket.
pub fn spawn_with_api(exe: &Path, args: &[&str], sock: &Path) -> Result<OwnedChild, BenchError> {
    let _ = std::fs::remove_file(sock);
    let mut child = spawn_owned(
        Command::new(exe)
            .args(args)
            .args(["--json", "--console", "off"])
            .arg("--api-socket")
            .arg(sock)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        &exe.display().to_string(),
    )?
    .owning(sock);
    let started = Instant::now();
    while !sock.exists() {
        // A child that failed (a bad flag, a host refusal) says why on its
        // stderr: shown as it printed it, not as a missing socket.
        if let Ok(Some(_)) = child.try_wait() {
            return Err(child_failed(child, "exited before opening its API socket"));
        }
        if started.elapsed() > std::time::Duration::from_secs(30) {
            let _ = child.kill();
            return Err(child_failed(child, "never opened its API socket (30 s)"));
        }
        thread::sleep(std::time::Duration::from_millis(2));
    }
    Ok(child)
}

/// A child's failure, with what it printed on stderr.
fn child_failed(child: OwnedChild, what: &str) -> BenchError {
    match child.into_inner().wait_with_output() {
        Ok(out) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let said = stderr.trim();
            guest(&format!(
                "hover {what} ({}){}{said}",
                out.status,
                if said.is_empty() { "" } else { ":\n" }
            ))
        }
        Err(e) => guest(&format!("hover {what}; its output: {e}")),
    }
}

/// The TSC rate in kHz, measured once against the monotonic clock over
/// 200 ms (the guest's TSC is the host's here).
pub fn tsc_khz() -> Result<u64, BenchError> {
    static KHZ: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let khz = *KHZ.get_or_init(|| {
        let (t0, c0) = (Instant::now(), rdtsc());
        thread::sleep(std::time::Duration::from_millis(200));
        let (dt, dc) = (t0.elapsed(), rdtsc() - c0);
        (dc as f64 / dt.as_secs_f64() / 1000.0) as u64
    });
    if khz == 0 {
        return Err(guest("cannot measure the TSC rate"));
    }
    Ok(khz)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_that_fails_before_its_socket_is_shown_as_it_printed() {
        let dir = std::env::temp_dir().join(format!("hover-runner-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("api.sock");
        // Stands in for a `hover run` refusing its flags.
        let err = spawn_with_api(
            Path::new("/bin/sh"),
            &[
                "-c",
                "echo 'hover: error: --memory 256 bytes is not a multiple of 4 KiB' >&2; exit 2",
                "sh",
            ],
            &sock,
        )
        .expect_err("the child failed");
        let text = err.to_string();
        assert!(
            text.contains("exited before opening its API socket"),
            "{text}"
        );
        assert!(
            text.contains("--memory 256 bytes is not a multiple of 4 KiB"),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failed_run_is_shown_with_its_lines_as_printed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("hover-run-fails-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Stands in for `hover run` refusing a flag the bench passed on.
        let exe = dir.join("hover");
        std::fs::write(
            &exe,
            "#!/bin/sh\necho \"error: invalid value '2x' for '--page-store-latency'\" >&2\n\
             echo >&2\necho \"For more information, try '--help'.\" >&2\nexit 2\n",
        )
        .unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let text = run_hover(&exe, &["--page-store-latency", "2x"])
            .err()
            .expect("the child failed")
            .to_string();
        assert!(
            text.contains("exit status: 2; the end of its output:\nerror: invalid value '2x' for '--page-store-latency'\n\nFor more information"),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_dropped_child_is_ended_and_reaped() {
        let child = spawn_owned(Command::new("sleep").arg("600"), "sleep").unwrap();
        let pid = child.id() as i32;
        drop(child);
        // SAFETY: signal 0 only asks whether the pid exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0;
        assert!(!alive, "the child outlived its owner");
    }
}
