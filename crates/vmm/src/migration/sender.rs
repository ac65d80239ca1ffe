//! A migration sender in a separate process (seed 3's setting): the VMM
//! tells it which pages to send; it reads them from the VMM's guest memory
//! by one of the [`MapMode`]s, builds the page frames and writes them to
//! the migration connection itself. The VMM keeps the conversation (CONF,
//! STATE, END, the destination's answers) and waits for each request's
//! answer before it writes again, so frames never interleave.
//!
//! The helper is this executable run as `__migration-sender` (the `hover`
//! binary dispatches it to [`child_main`]); it inherits the connection, a
//! control socket and the guest memfds, and dies with its parent.
//!
//! Control protocol (a Unix socket pair, little-endian): first the VMM
//! sends one byte, 1 if the link is authenticated (then the 32-byte frame
//! key of the source's direction follows: never on the command line) or 0.
//! A request is `count u32, flags u32, seq u64` (bit 0: skip pages of
//! zeros; bit 1: read the pages only, send nothing; `seq`: the MAC
//! sequence number of the first frame) and `count` page addresses u64;
//! `count = 0, flags = u32::MAX` ends the helper. An answer is `pages sent
//! (or read) u64, bytes written u64, CPU µs the helper spent on requests so
//! far u64, the next frame's sequence number u64, error length u32` and the
//! error's UTF-8 text (empty when the request was done).

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use super::batch::{BatchError, Batcher};
use super::mac::FrameMac;
use super::mapper::{MapMode, Region, RemoteMemory};
use super::wire::FrameWriter;
use crate::memory::GuestRam;

/// The hidden subcommand that runs [`child_main`].
pub const SUBCOMMAND: &str = "__migration-sender";
const SKIP_ZERO: u32 = 1;
/// Read the pages but send nothing: the mapping micro-benchmark.
const READ_ONLY: u32 = 2;
const END: u32 = u32::MAX;

/// The VMM's side of a sender process.
pub struct ProcessSender {
    child: Child,
    ctl: UnixStream,
    /// CPU time the helper spent on requests so far (its start-up not
    /// included), microseconds.
    pub cpu_us: u64,
}

impl ProcessSender {
    /// Start a helper that reads `ram` by `mode`, sends frames of `batch`
    /// pages on `conn`.
    pub fn spawn(
        mode: MapMode,
        ram: &GuestRam,
        conn: &impl AsRawFd,
        batch: usize,
        mac: Option<&FrameMac>,
    ) -> io::Result<ProcessSender> {
        let regions: Vec<Region> = ram
            .memory()
            .iter()
            .map(|r| Region {
                gpa: r.start_addr().0,
                len: r.len(),
                addr: r
                    .get_host_address(vm_memory::MemoryRegionAddress(0))
                    .map_or(0, |p| p as u64),
                fd: r.file_offset().map_or(-1, |f| f.file().as_raw_fd()),
                offset: r.file_offset().map_or(0, |f| f.start()),
            })
            .collect();
        if mode.needs_memfd() && regions.iter().any(|r| r.fd < 0) {
            return Err(io::Error::other(format!(
                "a sender process that maps guest memory ({}) needs the VM started with --memory-backend memfd; readv works with either backend",
                mode.name()
            )));
        }
        let (mine, theirs) = UnixStream::pair()?;
        let conn_fd = conn.as_raw_fd();
        let ctl_fd = theirs.as_raw_fd();
        let mut keep: Vec<RawFd> = regions.iter().map(|r| r.fd).filter(|&f| f >= 0).collect();
        keep.extend([conn_fd, ctl_fd]);
        let exe = std::env::current_exe()?;
        let mut cmd = Command::new(exe);
        cmd.arg(SUBCOMMAND)
            .args(["--pid", &std::process::id().to_string()])
            .args(["--mode", mode.name()])
            .args(["--batch", &batch.to_string()])
            .args(["--conn-fd", &conn_fd.to_string()])
            .args(["--ctl-fd", &ctl_fd.to_string()])
            .args(["--seccomp", crate::seccomp::mode().name()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Its own process group: a terminal's Ctrl-C reaches the VMM,
            // which ends the VM once the migration is over, and not the
            // helper the migration needs until then.
            .process_group(0);
        for r in &regions {
            cmd.args(["--region", &r.to_arg()]);
        }
        // SAFETY: only async-signal-safe calls (fcntl, prctl) between fork
        // and exec.
        unsafe {
            cmd.pre_exec(move || {
                for &fd in &keep {
                    let flags = libc::fcntl(fd, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                // The helper never outlives the VMM.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        // Through the broker: a confined control thread may not start a
        // program itself.
        let child = crate::seccomp::broker::spawn(cmd)?;
        drop(theirs);
        let mut ctl = mine;
        let mut first = vec![mac.is_some() as u8];
        if let Some(m) = mac {
            first.extend_from_slice(&m.key_bytes());
        }
        ctl.write_all(&first)?;
        // Let the helper read this process's memory where Yama restricts
        // ptrace to ancestors (harmless elsewhere).
        // SAFETY: plain prctl on this process.
        unsafe { libc::prctl(libc::PR_SET_PTRACER, child.id() as libc::c_ulong) };
        Ok(ProcessSender {
            child,
            ctl,
            cpu_us: 0,
        })
    }

    /// Have the helper send the pages at `gpas` (skipping pages of zeros if
    /// `skip_zero`), its frames carrying on `mac`'s sequence on an
    /// authenticated link: the pages and bytes it sent.
    pub fn send(
        &mut self,
        gpas: &[u64],
        skip_zero: bool,
        mac: Option<&mut FrameMac>,
    ) -> io::Result<(u64, u64)> {
        let seq = mac.as_ref().map_or(0, |m| m.seq());
        let (pages, bytes, next) =
            self.request(gpas, if skip_zero { SKIP_ZERO } else { 0 }, seq)?;
        if let Some(m) = mac {
            m.set_seq(next);
        }
        Ok((pages, bytes))
    }

    /// Have the helper read the pages at `gpas` and send nothing (how much
    /// the reading costs: the mapping micro-benchmark). Pages read.
    pub fn read_only(&mut self, gpas: &[u64]) -> io::Result<u64> {
        self.request(gpas, READ_ONLY, 0).map(|(n, _, _)| n)
    }

    fn request(&mut self, gpas: &[u64], flags: u32, seq: u64) -> io::Result<(u64, u64, u64)> {
        let mut req = Vec::with_capacity(16 + gpas.len() * 8);
        req.extend_from_slice(&(gpas.len() as u32).to_le_bytes());
        req.extend_from_slice(&flags.to_le_bytes());
        req.extend_from_slice(&seq.to_le_bytes());
        for g in gpas {
            req.extend_from_slice(&g.to_le_bytes());
        }
        self.ctl.write_all(&req).map_err(|e| self.gone(e))?;
        let mut a = [0u8; 36];
        self.ctl.read_exact(&mut a).map_err(|e| self.gone(e))?;
        let word = |i: usize| u64::from_le_bytes(a[i..i + 8].try_into().expect("8 bytes"));
        let (pages, bytes, next) = (word(0), word(8), word(24));
        self.cpu_us = word(16);
        let elen = u32::from_le_bytes(a[32..36].try_into().expect("4 bytes")) as usize;
        if elen > 0 {
            let mut e = vec![0u8; elen.min(1 << 16)];
            self.ctl.read_exact(&mut e).map_err(|e| self.gone(e))?;
            return Err(io::Error::other(format!(
                "the sender process: {}",
                String::from_utf8_lossy(&e)
            )));
        }
        Ok((pages, bytes, next))
    }

    fn gone(&mut self, e: io::Error) -> io::Error {
        let status = self.child.try_wait().ok().flatten();
        io::Error::other(format!(
            "the sender process is gone ({e}; {})",
            status.map_or("still running".into(), |s| s.to_string())
        ))
    }
}

impl Drop for ProcessSender {
    fn drop(&mut self) {
        let mut end = [0u8; 16];
        end[4..8].copy_from_slice(&END.to_le_bytes());
        if self.ctl.write_all(&end).is_err() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// What the helper is told on its command line.
#[derive(Debug)]
struct Args {
    pid: libc::pid_t,
    mode: MapMode,
    batch: usize,
    conn_fd: RawFd,
    ctl_fd: RawFd,
    regions: Vec<Region>,
    seccomp: crate::seccomp::Mode,
}

/// Why the helper's command line was refused (only the VMM starts it, so
/// this is a mismatch between the two builds or a person trying it).
#[derive(Debug, thiserror::Error)]
enum ArgsError {
    /// A flag at the end, without its value.
    #[error("{0} needs a value")]
    NoValue(String),
    /// A value its own parser refused, in that parser's words.
    #[error("{0}")]
    Value(String),
    /// A `--region` that does not parse.
    #[error(transparent)]
    Region(#[from] super::mapper::RegionArgError),
    /// A number that does not parse.
    #[error("{flag} {value}: {why}")]
    Bad {
        /// The flag.
        flag: String,
        /// Its value.
        value: String,
        /// The parser's complaint.
        why: String,
    },
    /// A flag the helper does not take.
    #[error("unknown argument {0}")]
    Unknown(String),
    /// A flag it needs is missing.
    #[error("needs --pid, --batch, --conn-fd, --ctl-fd and --region")]
    Missing,
    /// A batch larger than a frame carries.
    #[error("--batch {0} is over {max}", max = super::wire::MAX_BATCH)]
    Batch(usize),
}

fn parse(args: &[String]) -> Result<Args, ArgsError> {
    let mut a = Args {
        pid: 0,
        mode: MapMode::Readv,
        batch: 0,
        conn_fd: -1,
        ctl_fd: -1,
        regions: Vec::new(),
        seccomp: crate::seccomp::Mode::On,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| ArgsError::NoValue(flag.clone()))?;
        let bad = |why: &dyn std::fmt::Display| ArgsError::Bad {
            flag: flag.clone(),
            value: v.clone(),
            why: why.to_string(),
        };
        let num = |v: &str| v.parse::<i64>().map_err(|e| bad(&e));
        match flag.as_str() {
            "--pid" => a.pid = num(v)? as libc::pid_t,
            "--mode" => a.mode = v.parse().map_err(ArgsError::Value)?,
            "--batch" => a.batch = num(v)? as usize,
            "--conn-fd" => a.conn_fd = num(v)? as RawFd,
            "--ctl-fd" => a.ctl_fd = num(v)? as RawFd,
            "--region" => a.regions.push(Region::parse(v)?),
            "--seccomp" => a.seccomp = v.parse().map_err(ArgsError::Value)?,
            _ => return Err(ArgsError::Unknown(flag.clone())),
        }
    }
    if a.pid <= 0 || a.batch == 0 || a.conn_fd < 0 || a.ctl_fd < 0 || a.regions.is_empty() {
        return Err(ArgsError::Missing);
    }
    if a.batch > super::wire::MAX_BATCH {
        return Err(ArgsError::Batch(a.batch));
    }
    Ok(a)
}

/// The helper's main: serve requests until told to end. Returns the exit
/// status (0, or 2 for bad arguments: it is started only by the VMM).
pub fn child_main(args: &[String]) -> i32 {
    let a = match parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("hover {SUBCOMMAND}: {e} (this helper is started by the VMM itself)");
            return 2;
        }
    };
    // SAFETY: the VMM handed us these descriptors, ours from now on.
    let (conn, mut ctl) = unsafe {
        (
            std::fs::File::from_raw_fd(a.conn_fd),
            UnixStream::from_raw_fd(a.ctl_fd),
        )
    };
    // The link's frame key, if it is authenticated: read before anything else.
    let mut first = [0u8; 1];
    if ctl.read_exact(&mut first).is_err() {
        return 0;
    }
    let mac = match first[0] {
        0 => None,
        _ => {
            let mut key = [0u8; 32];
            if ctl.read_exact(&mut key).is_err() {
                return 0;
            }
            Some(FrameMac::from_key_bytes(key))
        }
    };
    let mut mem = match RemoteMemory::new(a.mode, a.pid, a.regions) {
        Ok(m) => Ok(m),
        Err(e) => Err(e.to_string()),
    };
    // Set up: from here the helper only reads guest memory and writes frames.
    if let Err(e) = crate::seccomp::apply(crate::seccomp::Kind::Sender, a.seccomp) {
        eprintln!("hover {SUBCOMMAND}: {e}");
        return 1;
    }
    let mut w = FrameWriter::new(conn);
    if let Some(m) = mac {
        w.set_mac(m);
    }
    let mut frames = Batcher::new(a.batch);
    let mut serving_us = 0u64;
    loop {
        let mut h = [0u8; 16];
        if ctl.read_exact(&mut h).is_err() {
            return 0;
        }
        let count = u32::from_le_bytes(h[0..4].try_into().expect("4 bytes")) as usize;
        let flags = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes"));
        if let Some(m) = w.mac_mut() {
            m.set_seq(u64::from_le_bytes(h[8..16].try_into().expect("8 bytes")));
        }
        if count == 0 && flags == END {
            return 0;
        }
        let mut raw = vec![0u8; count * 8];
        if ctl.read_exact(&mut raw).is_err() {
            return 0;
        }
        let gpas: Vec<u64> = raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        let (bytes0, cpu0) = (w.bytes, crate::host::thread_cpu_us());
        let result = match &mut mem {
            Ok(m) if flags & READ_ONLY != 0 => {
                frames.read_only(&gpas, &mut |chunk, out| m.read(chunk, out))
            }
            Ok(m) => frames
                .send(
                    &mut w,
                    &gpas,
                    flags & SKIP_ZERO != 0,
                    &mut |chunk, out| m.read(chunk, out),
                    &mut |_| {},
                )
                .map_err(|e| match e {
                    BatchError::Read(e) | BatchError::Write(e) => e,
                }),
            Err(e) => Err(io::Error::other(e.clone())),
        };
        serving_us += crate::host::thread_cpu_us().saturating_sub(cpu0);
        let (pages, err) = match result {
            Ok(n) => (n, String::new()),
            Err(e) => (0, e.to_string()),
        };
        let mut ans = Vec::with_capacity(36 + err.len());
        ans.extend_from_slice(&pages.to_le_bytes());
        ans.extend_from_slice(&(w.bytes - bytes0).to_le_bytes());
        ans.extend_from_slice(&serving_us.to_le_bytes());
        ans.extend_from_slice(&w.mac().map_or(0, |m| m.seq()).to_le_bytes());
        ans.extend_from_slice(&(err.len() as u32).to_le_bytes());
        ans.extend_from_slice(err.as_bytes());
        if ctl.write_all(&ans).is_err() {
            return 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helper_arguments_are_checked() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(parse(&s(&["--pid"]))
            .unwrap_err()
            .to_string()
            .contains("needs a value"));
        assert!(parse(&s(&["--what", "1"]))
            .unwrap_err()
            .to_string()
            .contains("unknown"));
        assert!(parse(&s(&["--pid", "1"]))
            .unwrap_err()
            .to_string()
            .contains("needs"));
        let ok = s(&[
            "--pid",
            "1",
            "--mode",
            "per-page",
            "--batch",
            "16",
            "--conn-fd",
            "4",
            "--ctl-fd",
            "5",
            "--region",
            "0:1000:0:3:0",
        ]);
        let a = parse(&ok).unwrap();
        assert_eq!(a.mode, MapMode::PerPage);
        assert_eq!(a.regions.len(), 1);
        let mut big = ok.clone();
        big[5] = "100000".into();
        assert!(parse(&big).unwrap_err().to_string().contains("--batch"));
    }
}
