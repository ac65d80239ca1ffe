//! The QEMU peer (`--peer qemu`): the same guest image, booted by QEMU
//! through its PVH entry, on the same host and workload, timed as a whole
//! process like `hover run`.
//!
//! Without Hover's devices the guest prints its reports on the serial
//! console as `hover run` does (`  vcpu N   key = value`) and exits through
//! `isa-debug-exit`, which ends QEMU with status `(code << 1) | 1`. The
//! bench installs nothing: without `qemu-system-x86_64` it says which
//! Debian package provides it and leaves the peer column out.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The binary looked for on `PATH`.
pub const QEMU: &str = "qemu-system-x86_64";
/// The Debian package that provides it.
pub const QEMU_PACKAGE: &str = "qemu-system-x86";

/// QEMU machine types compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Machine {
    /// `microvm`: no PCI, no option ROMs, qboot; QEMU at its fastest.
    Microvm,
    /// `pc`: the common configuration (SeaBIOS, PCI), for context.
    Pc,
}

impl Machine {
    /// The `-M` argument.
    fn arg(self) -> &'static str {
        match self {
            Machine::Microvm => "microvm,x-option-roms=off,rtc=off",
            Machine::Pc => "pc",
        }
    }

    /// The name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Machine::Microvm => "QEMU microvm",
            Machine::Pc => "QEMU pc",
        }
    }
}

/// Why the peer could not run.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// No QEMU binary.
    #[error("{QEMU} is not installed: install the Debian package {QEMU_PACKAGE} (apt-get install {QEMU_PACKAGE}) for the QEMU column")]
    Missing,
    /// QEMU did not start, or stopped before the guest finished.
    #[error("QEMU failed ({status}): {detail}")]
    Failed {
        /// Its exit status.
        status: String,
        /// The end of its error output, or what was missing.
        detail: String,
    },
    /// It ran longer than allowed.
    #[error("QEMU did not finish within {0:?} (killed)")]
    Timeout(Duration),
}

/// One report line.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The vCPU that sent it.
    pub vcpu: u32,
    /// The key.
    pub key: String,
    /// The value as printed.
    pub value: String,
}

/// What a QEMU run gave.
#[derive(Clone, Debug)]
pub struct PeerRun {
    /// The guest's exit code.
    pub exit_code: u32,
    /// Its reports, in order.
    pub reports: Vec<Report>,
    /// Start of the process to its exit.
    pub wall: Duration,
    /// Start of the process to the first byte on the serial console.
    pub first_console_byte: Option<Duration>,
    /// Everything the guest printed.
    pub console: String,
}

impl PeerRun {
    /// The value of report `key` as a number.
    pub fn number(&self, key: &str) -> Option<f64> {
        self.reports
            .iter()
            .find(|r| r.key == key)
            .and_then(|r| r.value.parse().ok())
    }
}

/// The built-in guest's ELF as `hover guest-image` writes it (the image
/// the peer boots), in a temporary file removed when this is dropped (or
/// if a signal ends the bench).
pub struct GuestImageFile(crate::hover_process::TempPath);

impl GuestImageFile {
    /// Write it with the `hover` binary at `exe`.
    pub fn write(exe: &Path) -> Result<Self, crate::BenchError> {
        let path = std::env::temp_dir().join(format!("hover-bench-guest-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let file = GuestImageFile(crate::hover_process::TempPath::new(path));
        let made = Command::new(exe)
            .args(["guest-image", "--out"])
            .arg(file.path())
            .status()
            .map_err(|e| crate::BenchError::Guest(format!("hover guest-image: {e}")))?;
        if !made.success() {
            return Err(crate::BenchError::Guest(format!(
                "hover guest-image failed: {made}"
            )));
        }
        Ok(file)
    }

    /// Where the image is.
    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

/// The last `n` lines of `text`, last first, joined with " | " (for error
/// messages that quote a console or QEMU's stderr).
pub fn last_lines(text: &str, n: usize) -> String {
    text.lines().rev().take(n).collect::<Vec<_>>().join(" | ")
}

/// Find QEMU on `PATH`.
pub fn find() -> Result<PathBuf, PeerError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(QEMU))
        .find(|p| p.is_file())
        .ok_or(PeerError::Missing)
}

/// Parse the guest's report lines (`  vcpu N   key = value`) out of its
/// serial output; other lines are ignored.
pub fn parse_reports(console: &str) -> Vec<Report> {
    console
        .lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix("vcpu ")?;
            let (vcpu, rest) = rest.split_once(char::is_whitespace)?;
            let (key, value) = rest.trim_start().split_once(" = ")?;
            let key = key.trim();
            let ok = !key.is_empty()
                && key.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'_'
                });
            if !ok {
                return None;
            }
            Some(Report {
                vcpu: vcpu.parse().ok()?,
                key: key.to_string(),
                value: value.trim().to_string(),
            })
        })
        .collect()
}

/// The guest's exit code from QEMU's exit status and the guest's last
/// words (`guest: exit code N`): isa-debug-exit gives `(N << 1) | 1`, but
/// QEMU's own failures exit 1 too, so the line must agree.
pub fn guest_exit(status: Option<i32>, console: &str) -> Option<u32> {
    let said: u32 = console
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("guest: exit code "))?
        .trim()
        .parse()
        .ok()?;
    let status = status?;
    (status & 1 == 1 && (status >> 1) as u32 == said & 0x7f).then_some(said)
}

/// How QEMU boots the guest.
#[derive(Clone, Copy, Debug)]
pub struct Boot<'a> {
    /// The machine type.
    pub machine: Machine,
    /// The guest's ELF (its PVH entry).
    pub image: &'a Path,
    /// vCPUs (`-smp`): the boot vCPU enters at the PVH entry and starts
    /// the others itself.
    pub vcpus: u32,
    /// Guest memory, MiB.
    pub memory_mib: u32,
    /// The guest's command line (`-append`).
    pub cmdline: &'a str,
    /// KVM dirty rings of this many entries per vCPU instead of the bitmap.
    pub dirty_ring: Option<u32>,
    /// Pin the guest's TSC rate (kHz): QEMU refuses to migrate a guest
    /// that sees an invariant TSC unless its rate is fixed.
    pub tsc_khz: Option<u64>,
    /// More arguments (devices).
    pub extra: &'a [String],
}

/// QEMU's command line for `boot`, no devices but isa-debug-exit;
/// the caller picks the serial console (and monitor).
pub fn command(qemu: &Path, boot: &Boot) -> Command {
    let mut accel = "kvm".to_string();
    if let Some(n) = boot.dirty_ring {
        accel += &format!(",dirty-ring-size={n}");
    }
    // The guest reads its TSC rate from CPUID 0x4000_0010, which QEMU
    // offers only with an invariant TSC; -arch-capabilities: QEMU cannot
    // set MSR 0x10a on this KVM.
    let mut cpu = "host,-arch-capabilities,+invtsc".to_string();
    if let Some(khz) = boot.tsc_khz {
        cpu += &format!(",tsc-frequency={}", khz * 1000);
    }
    let mut c = Command::new(qemu);
    c.args(["-M", boot.machine.arg()])
        .args(["-accel", &accel, "-cpu", &cpu])
        .args(["-m", &boot.memory_mib.to_string()])
        .args(["-smp", &boot.vcpus.to_string()])
        .arg("-kernel")
        .arg(boot.image)
        .args(["-append", boot.cmdline])
        .args(["-nographic", "-no-reboot", "-nodefaults"])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"])
        .args(boot.extra);
    // QEMU ends with the bench, as a VM of Hover's does.
    crate::hover_process::dies_with_bench(&mut c);
    c
}

impl<'a> Boot<'a> {
    /// `image` with `cmdline` on `machine`: `vcpus` vCPUs, `memory_mib`
    /// MiB, the dirty bitmap, the TSC rate left to QEMU.
    pub fn new(
        machine: Machine,
        image: &'a Path,
        vcpus: u32,
        memory_mib: u32,
        cmdline: &'a str,
    ) -> Self {
        Boot {
            machine,
            image,
            vcpus,
            memory_mib,
            cmdline,
            dirty_ring: None,
            tsc_khz: None,
            extra: &[],
        }
    }
}

/// Boot the guest under QEMU as `boot` says; stop it after `timeout`.
pub fn run(qemu: &Path, boot: &Boot, timeout: Duration) -> Result<PeerRun, PeerError> {
    let started = Instant::now();
    let mut child = command(qemu, boot)
        .args(["-serial", "stdio"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| PeerError::Failed {
            status: "not started".into(),
            detail: format!("cannot run {}: {e}", qemu.display()),
        })?;
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut first = [0u8; 1];
        let at = out.read_exact(&mut first).ok().map(|_| Instant::now());
        let mut rest = Vec::new();
        let _ = out.read_to_end(&mut rest);
        let mut all = Vec::from(&first[..at.map_or(0, |_| 1)]);
        all.extend(rest);
        (at, String::from_utf8_lossy(&all).into_owned())
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if started.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(PeerError::Timeout(timeout));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => {
                return Err(PeerError::Failed {
                    status: "unknown".into(),
                    detail: format!("waiting for QEMU: {e}"),
                })
            }
        }
    };
    let wall = started.elapsed();
    let (first, console) = reader.join().unwrap_or((None, String::new()));
    let stderr = err_reader.join().unwrap_or_default();
    let exit_code = guest_exit(status.code(), &console).ok_or_else(|| PeerError::Failed {
        status: status.to_string(),
        detail: {
            let tail = last_lines(&stderr, 3);
            if tail.is_empty() {
                "the guest did not report its exit".into()
            } else {
                tail
            }
        },
    })?;
    Ok(PeerRun {
        exit_code,
        reports: parse_reports(&console),
        wall,
        first_console_byte: first.map(|t| t.duration_since(started)),
        console,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lines_are_parsed_and_other_lines_ignored() {
        let console = "hello from vCPU 0 of 1 (x2APIC id 0)\n  vcpu 0   vcpus_seen = 1\n\
                       hello: all 1 vCPUs checked in\n  vcpu 1   timer.avg_ns = 69193\n\
                       vcpu 2 spin.rate = -1.5\n  vcpu x   bad = 1\n  vcpu 0   Bad Key = 2\n\
                       guest: exit code 0\n";
        let r = parse_reports(console);
        assert_eq!(
            r,
            vec![
                Report {
                    vcpu: 0,
                    key: "vcpus_seen".into(),
                    value: "1".into()
                },
                Report {
                    vcpu: 1,
                    key: "timer.avg_ns".into(),
                    value: "69193".into()
                },
                Report {
                    vcpu: 2,
                    key: "spin.rate".into(),
                    value: "-1.5".into()
                },
            ]
        );
    }

    #[test]
    fn the_exit_code_needs_both_the_status_and_the_guests_word() {
        assert_eq!(guest_exit(Some(1), "guest: exit code 0\n"), Some(0));
        assert_eq!(guest_exit(Some(45), "x\nguest: exit code 22\n"), Some(22));
        // QEMU's own failure (exit 1) without the guest's line.
        assert_eq!(guest_exit(Some(1), "qemu: could not load kernel\n"), None);
        // Killed by a signal, or a status that disagrees with the line.
        assert_eq!(guest_exit(None, "guest: exit code 0\n"), None);
        assert_eq!(guest_exit(Some(3), "guest: exit code 0\n"), None);
    }

    #[test]
    fn a_qemu_that_cannot_start_is_a_clear_error() {
        let e = run(
            Path::new("/nonexistent/qemu-system-x86_64"),
            &Boot::new(
                Machine::Microvm,
                Path::new("/nonexistent/guest"),
                1,
                128,
                "workload=hello",
            ),
            Duration::from_secs(5),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("cannot run /nonexistent/qemu-system-x86_64"),
            "{e}"
        );
        assert!(PeerError::Missing.to_string().contains("qemu-system-x86"));
    }
}
