//! The paravirtual I/O device (docs/ABI.md, `hover_abi::pvio`): synchronous
//! writes to a host file, for the halt-polling experiment.
//!
//! The guest's doorbell is an ioeventfd, so a submission never exits to a
//! vCPU thread of the monitor; this device's I/O thread performs the write
//! (the file is opened O_DSYNC: each write is durable before it completes,
//! like the seed's unmergeable synchronous writes) and signals completion
//! through an irqfd routed as an MSI to the submitting vCPU, whose task is
//! meanwhile asleep and whose vCPU has typically halted.

use crate::sync::Locked;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;

use super::gate::Gate;
use super::host_file::HostFileError;
use hover_abi::pvio::{
    self, io_op, io_status, COMPLETION_VECTOR, DOORBELL_PORT, MAX_ENTRIES, MAX_FILE_BYTES, MAX_LEN,
};
use kvm_bindings::{
    kvm_irq_routing_entry, KvmIrqRouting, KVM_IRQCHIP_IOAPIC, KVM_IRQ_ROUTING_IRQCHIP,
    KVM_IRQ_ROUTING_MSI,
};
use kvm_ioctls::{IoEventAddress, NoDatamatch, VmFd};
use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, GuestAddress};

use crate::memory::host_writes::GuestWriter;
use vmm_sys_util::eventfd::EventFd;

/// Why the I/O device cannot serve a ring.
#[derive(Debug, thiserror::Error)]
pub enum PvioError {
    /// Its I/O thread has ended.
    #[error("its thread has stopped")]
    ThreadGone,
    /// The file cannot be opened.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// What was opened may not take the guest's writes ([`fit_for_io`]).
    #[error("{}: {why}", path.display())]
    Unfit {
        /// The file.
        path: PathBuf,
        /// Why not.
        why: HostFileError,
    },
    /// A saved ring that cannot be served again.
    #[error("the saved I/O ring {0}")]
    SavedRing(String),
}

/// Where the I/O thread is to serve from, and where it answers whether it
/// could open the file.
struct Start {
    gpa: u64,
    entries: u64,
    done: u64,
    reply: Sender<Result<(), PvioError>>,
}

/// The I/O thread: wait to be started, open the file, serve until stopped.
/// It holds the device only weakly while it waits, so a device dropped
/// before its guest set it up ends the thread.
fn io_thread(dev: Weak<PvioDevice>, rx: Receiver<Start>) {
    while let Ok(s) = rx.recv() {
        let Some(dev) = dev.upgrade() else { return };
        match dev.open() {
            Ok(file) => {
                let _ = s.reply.send(Ok(()));
                dev.serve(file, s.gpa, s.entries, s.done);
                return;
            }
            Err(e) => {
                let _ = s.reply.send(Err(e));
            }
        }
    }
}

/// GSIs the IOAPIC pins occupy; the device's per-vCPU MSI routes follow.
const IOAPIC_PINS: u32 = 24;
const HEADER: u64 = pvio::HEADER_SIZE;
const REQUEST: u64 = pvio::REQUEST_SIZE;
/// Where the monitor counts completions: the header's `completed`.
const COMPLETED: u64 = pvio::header_offset::COMPLETED;
/// A request's answer: `status`, then `error` right after it.
const STATUS: u64 = pvio::request_offset::STATUS as u64;
const ERROR: u64 = pvio::request_offset::ERROR as u64;

/// What the device did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PvioStats {
    /// The file written.
    pub file: String,
    /// Requests completed.
    pub requests: u64,
    /// Requests refused as malformed.
    pub bad_requests: u64,
    /// Requests whose write failed.
    pub io_errors: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Completion interrupts not raised: the guest was polling for them
    /// (`idle=haltpoll`).
    pub irqs_skipped: u64,
}

/// The device's state, as saved in a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PvioState {
    /// The ring the guest set up: (guest-physical address, entries).
    pub ring: Option<(u64, u64)>,
    /// Requests completed.
    pub requests: u64,
    /// Requests refused as malformed.
    pub bad_requests: u64,
    /// Requests whose write failed.
    pub io_errors: u64,
    /// Bytes written.
    pub bytes: u64,
}

/// The device.
pub struct PvioDevice {
    /// The ring is read here; statuses and counts written back, recorded.
    guest: GuestWriter,
    doorbell: EventFd,
    irqfds: Vec<EventFd>,
    /// The ring, once the guest has set it up (once per run).
    ring: Mutex<Option<(u64, u64)>>,
    /// Closed while the VM is paused: no request is served.
    gate: Gate,
    path: PathBuf,
    /// The file is the device's own (the default): unlinked once open.
    own_file: bool,
    /// The I/O thread, started with the device (by the VM's own thread,
    /// so that it gets the I/O seccomp filter, not a vCPU's); it opens the
    /// file and serves the ring once told where it is.
    thread: Mutex<Option<JoinHandle<()>>>,
    start_tx: Mutex<Option<Sender<Start>>>,
    stop: AtomicBool,
    /// Boosts the submitting vCPU with (just after) its completion interrupt.
    booster: Option<Arc<crate::sched::boost::Booster>>,
    requests: AtomicU64,
    /// Completion interrupts skipped: the guest was polling for them.
    irqs_skipped: AtomicU64,
    bad: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
    max_bytes: u64,
    max_hit: super::limits::LimitHit,
}

fn routing(vcpus: u32) -> std::io::Result<KvmIrqRouting> {
    let mut entries = Vec::new();
    for pin in 0..IOAPIC_PINS {
        let mut e = kvm_irq_routing_entry {
            gsi: pin,
            type_: KVM_IRQ_ROUTING_IRQCHIP,
            ..Default::default()
        };
        e.u.irqchip.irqchip = KVM_IRQCHIP_IOAPIC;
        e.u.irqchip.pin = pin;
        entries.push(e);
    }
    for v in 0..vcpus {
        let mut e = kvm_irq_routing_entry {
            gsi: IOAPIC_PINS + v,
            type_: KVM_IRQ_ROUTING_MSI,
            ..Default::default()
        };
        e.u.msi.address_lo = 0xfee0_0000 | v << 12;
        e.u.msi.data = COMPLETION_VECTOR as u32;
        entries.push(e);
    }
    KvmIrqRouting::from_entries(&entries).map_err(|e| std::io::Error::other(format!("{e:?}")))
}

impl PvioDevice {
    /// Wire the device into `vm` (doorbell ioeventfd, one completion irqfd
    /// per vCPU). The file is opened when the guest sets the ring up;
    /// requests may reach `max_bytes` into it (`--guest-io-max`).
    pub fn new(
        vm: &VmFd,
        guest: GuestWriter,
        vcpus: u32,
        file: Option<&std::path::Path>,
        max_bytes: u64,
        booster: Option<Arc<crate::sched::boost::Booster>>,
    ) -> Result<Arc<Self>, crate::Error> {
        let host = |what, source| crate::Error::Host { what, source };
        let doorbell = EventFd::new(0).map_err(|e| host("create the I/O doorbell", e))?;
        vm.register_ioevent(
            &doorbell,
            &IoEventAddress::Pio(DOORBELL_PORT as u64),
            NoDatamatch,
        )
        .map_err(crate::KvmOp::RegisterIoevent.err())?;
        let table = routing(vcpus).map_err(|e| host("build the GSI routing", e))?;
        vm.set_gsi_routing(&table)
            .map_err(crate::KvmOp::SetGsiRouting.err())?;
        let mut irqfds = Vec::new();
        for v in 0..vcpus {
            let fd =
                EventFd::new(libc::EFD_NONBLOCK).map_err(|e| host("create an I/O irqfd", e))?;
            vm.register_irqfd(&fd, IOAPIC_PINS + v)
                .map_err(crate::KvmOp::RegisterIrqfd.err())?;
            irqfds.push(fd);
        }
        let (path, own_file) = match file {
            Some(p) => (p.to_path_buf(), false),
            None => {
                static N: AtomicU64 = AtomicU64::new(0);
                let dir = if std::path::Path::new("/dev/shm").is_dir() {
                    PathBuf::from("/dev/shm")
                } else {
                    std::env::temp_dir()
                };
                (
                    dir.join(format!(
                        "hover-io-{}-{}",
                        std::process::id(),
                        N.fetch_add(1, Ordering::Relaxed)
                    )),
                    true,
                )
            }
        };
        let dev = Arc::new(PvioDevice {
            guest,
            doorbell,
            irqfds,
            ring: Mutex::new(None),
            gate: Gate::default(),
            path,
            own_file,
            thread: Mutex::new(None),
            stop: AtomicBool::new(false),
            booster,
            requests: AtomicU64::new(0),
            irqs_skipped: AtomicU64::new(0),
            bad: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            max_bytes,
            max_hit: Default::default(),
            start_tx: Mutex::new(None),
        });
        let (tx, rx) = mpsc::channel();
        *dev.start_tx.locked() = Some(tx);
        let weak = Arc::downgrade(&dev);
        let t = crate::seccomp::spawn(crate::seccomp::Kind::Io, "pvio".into(), move || {
            io_thread(weak, rx)
        })
        .map_err(|e| host("start the I/O thread", e))?;
        *dev.thread.locked() = Some(t);
        Ok(dev)
    }

    /// The guest's IO_SETUP request: check the ring, open the file, start the
    /// I/O thread. Returns a control status.
    pub fn setup(self: &Arc<Self>, gpa: u64, entries: u64) -> u32 {
        use hover_abi::control::status;
        if entries == 0 || !entries.is_power_of_two() || entries > MAX_ENTRIES as u64 {
            return status::BAD_RANGE;
        }
        let mut probe = vec![0u8; (HEADER + entries * REQUEST) as usize];
        if self
            .guest
            .memory()
            .read_slice(&mut probe, GuestAddress(gpa))
            .is_err()
        {
            return status::BAD_RANGE;
        }
        let mut ring = self.ring.locked();
        if ring.is_some() {
            return status::BAD_OP;
        }
        match self.start(gpa, entries, 0) {
            Ok(()) => {
                *ring = Some((gpa, entries));
                status::OK
            }
            Err(e) => {
                tracing::warn!("I/O device: {e}");
                status::BAD_RANGE
            }
        }
    }

    /// Have the I/O thread open the file and serve the ring at `gpa` from
    /// request `done` on.
    fn start(&self, gpa: u64, entries: u64, done: u64) -> Result<(), PvioError> {
        let gone = || PvioError::ThreadGone;
        let tx = self.start_tx.locked().clone().ok_or_else(gone)?;
        let (reply, answer) = mpsc::channel();
        tx.send(Start {
            gpa,
            entries,
            done,
            reply,
        })
        .map_err(|_| gone())?;
        answer.recv().map_err(|_| gone())?
    }

    /// Open the file (on the I/O thread).
    fn open(&self) -> Result<File, PvioError> {
        // O_NONBLOCK: a FIFO put at the path after it was checked must not
        // hold the open (regular files and block devices ignore the flag).
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_DSYNC | libc::O_NONBLOCK)
            .open(&self.path)
            .map_err(|source| PvioError::Open {
                path: self.path.clone(),
                source,
            })?;
        // Checked again on what was opened: the path may have changed since
        // the configuration was checked.
        fit_for_io(&file).map_err(|why| PvioError::Unfit {
            path: self.path.clone(),
            why,
        })?;
        if self.own_file {
            // A file of our own making: only the descriptor is used from
            // here, so with the name gone nothing outlives the process,
            // however it ends. (The device opens its file once per run:
            // at the guest's setup, or at a restore.)
            if let Err(e) = std::fs::remove_file(&self.path) {
                tracing::warn!("I/O device: cannot unlink {}: {e}", self.path.display());
            }
        }
        Ok(file)
    }

    /// The device's state (the VM is paused).
    pub fn state(&self) -> PvioState {
        PvioState {
            ring: *self.ring.locked(),
            requests: self.requests.load(Ordering::Relaxed),
            bad_requests: self.bad.load(Ordering::Relaxed),
            io_errors: self.errors.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }

    /// Take up a saved state: serve the saved ring again, from where the
    /// saved device stopped (its completion count is in guest memory).
    pub fn restore(self: &Arc<Self>, s: &PvioState) -> Result<(), PvioError> {
        self.requests.store(s.requests, Ordering::Relaxed);
        self.bad.store(s.bad_requests, Ordering::Relaxed);
        self.errors.store(s.io_errors, Ordering::Relaxed);
        self.bytes.store(s.bytes, Ordering::Relaxed);
        let Some((gpa, entries)) = s.ring else {
            return Ok(());
        };
        if entries == 0 || !entries.is_power_of_two() || entries > MAX_ENTRIES as u64 {
            return Err(PvioError::SavedRing(format!("has {entries} entries")));
        }
        let done = self
            .guest
            .memory()
            .read_obj::<u64>(GuestAddress(gpa + COMPLETED))
            .map_err(|e| {
                PvioError::SavedRing(format!("at {gpa:#x} is outside guest memory: {e}"))
            })?;
        self.start(gpa, entries, done)?;
        *self.ring.locked() = Some((gpa, entries));
        // Requests submitted before the snapshot rang a doorbell that is gone.
        let _ = self.doorbell.write(1);
        Ok(())
    }

    /// Serve no request until [`Self::resume`]; returns when none is being served.
    pub fn pause(&self) {
        self.gate.close();
    }

    /// Serve requests again.
    pub fn resume(&self) {
        self.gate.open();
    }

    fn serve(&self, file: File, gpa: u64, entries: u64, mut done: u64) {
        let mut buf = Vec::new();
        loop {
            if self.doorbell.read().is_err() || self.stop.load(Ordering::Acquire) {
                return;
            }
            let _pass = self.gate.enter();
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            loop {
                let Ok(submitted) = self.guest.memory().read_obj::<u64>(GuestAddress(gpa)) else {
                    return;
                };
                if submitted <= done {
                    break;
                }
                if submitted - done > entries {
                    tracing::warn!("I/O device: the guest overran its ring ({submitted} submitted, {done} done); skipping");
                    done = submitted;
                    let _ = self.guest.write_obj(done, gpa + COMPLETED);
                    break;
                }
                let at = gpa + HEADER + (done % entries) * REQUEST;
                let (st, err, vcpu) = self.perform(&file, at, &mut buf);
                let _ = self.guest.write_obj(st, at + STATUS);
                let _ = self.guest.write_obj(err, at + ERROR);
                done += 1;
                let _ = self.guest.write_obj(done, gpa + COMPLETED);
                self.requests.fetch_add(1, Ordering::Relaxed);
                let index = if (vcpu as usize) < self.irqfds.len() {
                    vcpu as usize
                } else {
                    0
                };
                // A guest polling for this completion needs no interrupt.
                if crate::sched::guest_poll::completion_seen_by_poll(&self.guest, index) {
                    self.irqs_skipped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let _ = self.irqfds[index].write(1);
                // After the wake-up: see `Booster::on_interrupt`.
                if let Some(b) = &self.booster {
                    b.on_interrupt(index);
                }
            }
        }
    }

    /// Carry out the request at `at`: (status, errno, vCPU to interrupt).
    fn perform(&self, file: &File, at: u64, buf: &mut Vec<u8>) -> (u32, i32, u32) {
        let mut raw = [0u8; REQUEST as usize];
        if self
            .guest
            .memory()
            .read_slice(&mut raw, GuestAddress(at))
            .is_err()
        {
            self.bad.fetch_add(1, Ordering::Relaxed);
            return (io_status::BAD_REQUEST, 0, 0);
        }
        let u32_at = |o: usize| u32::from_le_bytes(raw[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(raw[o..o + 8].try_into().expect("8 bytes"));
        use pvio::request_offset as o;
        let (op, len, offset, gbuf, vcpu) = (
            u32_at(o::OP),
            u32_at(o::LEN),
            u64_at(o::OFFSET),
            u64_at(o::BUF),
            u32_at(o::VCPU),
        );
        let vcpu_ok = (vcpu as usize) < self.irqfds.len();
        let end = offset.checked_add(len as u64);
        let in_file = end.is_some_and(|e| e <= self.max_bytes);
        if end.is_some_and(|e| e <= MAX_FILE_BYTES) && !in_file {
            self.max_hit
                .hit("I/O file bytes", "guest-io-max", self.max_bytes);
        }
        buf.resize(len as usize, 0);
        if op != io_op::WRITE
            || len > MAX_LEN
            || !vcpu_ok
            || !in_file
            || self
                .guest
                .memory()
                .read_slice(buf, GuestAddress(gbuf))
                .is_err()
        {
            self.bad.fetch_add(1, Ordering::Relaxed);
            return (io_status::BAD_REQUEST, 0, if vcpu_ok { vcpu } else { 0 });
        }
        match file.write_all_at(buf, offset) {
            Ok(()) => {
                self.bytes.fetch_add(len as u64, Ordering::Relaxed);
                (io_status::OK, 0, vcpu)
            }
            Err(e) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                (
                    io_status::IO_ERROR,
                    e.raw_os_error().unwrap_or(libc::EIO),
                    vcpu,
                )
            }
        }
    }

    /// What the device did, or `None` if the guest never set it up.
    pub fn stats(&self) -> Option<PvioStats> {
        self.ring.locked().as_ref()?;
        Some(PvioStats {
            file: self.path.display().to_string(),
            requests: self.requests.load(Ordering::Relaxed),
            bad_requests: self.bad.load(Ordering::Relaxed),
            io_errors: self.errors.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            irqs_skipped: self.irqs_skipped.load(Ordering::Relaxed),
        })
    }

    /// Stop the I/O thread (the VM is stopping).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        // A thread still waiting to be started ends.
        self.start_tx.locked().take();
        self.gate.open();
        let _ = self.doorbell.write(1);
        if let Some(t) = self.thread.locked().take() {
            let _ = t.join();
        }
    }
}

/// Whether an opened file may take the guest's writes: a regular file or a
/// block device, not on procfs or sysfs (where "regular" files such as
/// /proc/self/mem reach the monitor's own memory or the kernel's knobs).
pub fn fit_for_io(file: &std::fs::File) -> Result<(), HostFileError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileTypeExt;
    let m = file.metadata().map_err(HostFileError::Stat)?;
    let t = m.file_type();
    if !(t.is_file() || t.is_block_device()) {
        return Err(HostFileError::NotStorage);
    }
    // SAFETY: fstatfs fills the struct for a descriptor we own.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) } != 0 {
        return Err(HostFileError::Statfs(std::io::Error::last_os_error()));
    }
    const PROC_SUPER_MAGIC: i64 = 0x9fa0;
    const SYSFS_MAGIC: i64 = 0x6265_6572;
    if [PROC_SUPER_MAGIC, SYSFS_MAGIC].contains(&(fs.f_type as i64)) {
        return Err(HostFileError::Pseudo);
    }
    Ok(())
}

/// [`fit_for_io`] for a path given by the user: fine if it does not exist
/// yet (it is created as a regular file).
pub fn check_io_path(path: &std::path::Path) -> Result<(), HostFileError> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::FileTypeExt;
    let writable = |p: &std::path::Path| -> Result<(), HostFileError> {
        let c = std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| HostFileError::NulInPath)?;
        // SAFETY: access() reads a NUL-terminated path.
        if unsafe { libc::access(c.as_ptr(), libc::W_OK) } != 0 {
            return Err(HostFileError::NotWritable(std::io::Error::last_os_error()));
        }
        Ok(())
    };
    match std::fs::metadata(path) {
        // Refused before any open: opening a FIFO would wait for a writer.
        Ok(m) if !(m.file_type().is_file() || m.file_type().is_block_device()) => {
            Err(HostFileError::NotStorage)
        }
        Ok(_) => {
            writable(path)?;
            match std::fs::File::open(path) {
                Ok(f) => fit_for_io(&f),
                // Not readable here (write-only, say): the open for writing decides.
                Err(_) => Ok(()),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => std::path::Path::new("."),
            };
            writable(dir).map_err(|e| HostFileError::CannotCreate(Box::new(e)))
        }
        Err(e) => Err(HostFileError::Stat(e)),
    }
}
