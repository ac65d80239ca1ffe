//! The control port device (docs/ABI.md): the guest writes the address of a
//! `ControlRequest`; this device carries it out and writes a status back.
//!
//! Everything the guest hands over is untrusted: addresses are checked against
//! RAM, counts against limits, records against the ABI; a bad request gets an
//! error status and changes nothing.

use crate::sync::Locked;
use std::sync::Mutex;

use std::time::Duration;

use hover_abi::control::{
    op, report_offset, request_offset, status, ControlRequest, Report, MAX_LOG_LEN,
    MAX_MSI_DELAY_NS, MAX_REPORTS_PER_REQUEST,
};

use super::limits::{GuestLimits, LimitHit};
use super::msi::{InjectError, MsiInjector, PendingMsi};
use super::state_error::StateError;
use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, GuestAddress};

use crate::memory::host_writes::GuestWriter;
use crate::report::{ReportEntry, ReportValue};

const REQUEST_SIZE: usize = std::mem::size_of::<ControlRequest>();
const REPORT_SIZE: usize = std::mem::size_of::<Report>();
/// Where the answer goes: the request's `status`.
const STATUS_OFFSET: u64 = request_offset::STATUS as u64;

/// What the vCPU should do next.
#[derive(Debug, PartialEq, Eq)]
pub enum ControlAction {
    /// Resume the guest.
    Continue,
    /// Power off with this exit code.
    Exit(u32),
}

/// A report as saved: the ABI's encoding of its value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedReport {
    /// The vCPU that sent it.
    pub vcpu: u32,
    /// The key.
    pub key: String,
    /// `hover_abi::control::value_kind`.
    pub kind: u32,
    /// The value's bits.
    pub bits: u64,
}

/// The control device's state: what the guest reported, and the MSIs it
/// asked for that are still waiting.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ControlState {
    /// Reports received, in order.
    pub reports: Vec<SavedReport>,
    /// Delayed MSIs not yet delivered.
    pub pending_msis: Vec<PendingMsi>,
    /// The boost area each vCPU registered (`None`: none).
    pub boost_areas: Vec<Option<u64>>,
}

/// The control device.
pub struct ControlDevice {
    /// Requests are read here; their statuses written back, recorded.
    guest: GuestWriter,
    reports: Mutex<Vec<ReportEntry>>,
    msi: Option<MsiInjector>,
    vcpus: u32,
    pvio: Option<std::sync::Arc<super::pvio::PvioDevice>>,
    booster: Option<std::sync::Arc<crate::sched::boost::Booster>>,
    limits: GuestLimits,
    /// Bytes of guest log messages passed on so far.
    logged: std::sync::atomic::AtomicU64,
    report_hit: LimitHit,
    log_hit: LimitHit,
    msi_hit: LimitHit,
}

fn decode_request(b: &[u8; REQUEST_SIZE]) -> ControlRequest {
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    ControlRequest {
        op: u32_at(request_offset::OP),
        status: u32_at(request_offset::STATUS),
        arg0: u64_at(request_offset::ARG0),
        arg1: u64_at(request_offset::ARG1),
    }
}

fn decode_report(b: &[u8]) -> Report {
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let mut key = [0u8; 32];
    let k = report_offset::KEY;
    let n = key.len();
    key.copy_from_slice(&b[k..k + n]);
    Report {
        key,
        kind: u32_at(report_offset::KIND),
        reserved: u32_at(report_offset::RESERVED),
        value: u64::from_le_bytes(
            b[report_offset::VALUE..report_offset::VALUE + 8]
                .try_into()
                .expect("8 bytes"),
        ),
    }
}

impl ControlDevice {
    /// A device reading requests from `guest`'s memory, injecting MSIs
    /// with `msi` (requests for MSIs fail without one) into `vcpus` vCPUs.
    pub fn new(guest: GuestWriter, msi: Option<MsiInjector>, vcpus: u32) -> Self {
        ControlDevice {
            guest,
            reports: Mutex::new(Vec::new()),
            msi,
            vcpus,
            pvio: None,
            booster: None,
            limits: GuestLimits::default(),
            logged: Default::default(),
            report_hit: Default::default(),
            log_hit: Default::default(),
            msi_hit: Default::default(),
        }
    }

    /// Bound what guest requests may ask for by `l` (the MSI injector's
    /// pending limit is set where it is built).
    pub fn with_limits(mut self, l: GuestLimits) -> Self {
        self.limits = l;
        self
    }

    /// Attach the booster that BOOST_* requests reach.
    pub fn with_booster(mut self, b: std::sync::Arc<crate::sched::boost::Booster>) -> Self {
        self.booster = Some(b);
        self
    }

    /// Attach the I/O device that IO_SETUP requests set up.
    pub fn with_pvio(mut self, pvio: std::sync::Arc<super::pvio::PvioDevice>) -> Self {
        self.pvio = Some(pvio);
        self
    }

    /// All reports so far, in arrival order.
    pub fn reports(&self) -> Vec<ReportEntry> {
        self.reports.locked().clone()
    }

    /// Stop delivering delayed MSIs and serving I/O (the VM pauses).
    pub fn pause(&self) {
        if let Some(m) = &self.msi {
            m.freeze();
        }
        if let Some(p) = &self.pvio {
            p.pause();
        }
    }

    /// Undo [`Self::pause`].
    pub fn resume(&self) {
        if let Some(p) = &self.pvio {
            p.resume();
        }
        if let Some(m) = &self.msi {
            m.thaw();
        }
    }

    /// The device's state (the VM is paused).
    pub fn state(&self) -> ControlState {
        ControlState {
            reports: self
                .reports()
                .into_iter()
                .map(|r| {
                    let (kind, bits) = r.value.to_raw();
                    SavedReport {
                        vcpu: r.vcpu as u32,
                        key: r.key,
                        kind,
                        bits,
                    }
                })
                .collect(),
            pending_msis: self.msi.as_ref().map(|m| m.pending()).unwrap_or_default(),
            boost_areas: self.booster.as_ref().map(|b| b.areas()).unwrap_or_default(),
        }
    }

    /// Take up a saved state: its reports, and its MSIs re-armed with the
    /// time they had left.
    pub fn restore(&self, s: &ControlState) -> Result<(), StateError> {
        const DEVICE: &str = "control port";
        let mut reports = Vec::with_capacity(s.reports.len());
        for r in &s.reports {
            let value = ReportValue::from_raw(r.kind, r.bits).ok_or_else(|| {
                StateError::unfit(
                    DEVICE,
                    format!("report {:?} has an unknown value kind {}", r.key, r.kind),
                )
            })?;
            reports.push(ReportEntry {
                vcpu: r.vcpu as usize,
                key: r.key.clone(),
                value,
            });
        }
        *self.reports.locked() = reports;
        if let Some(b) = &self.booster {
            b.restore(&s.boost_areas)
                .map_err(|e| StateError::unfit(DEVICE, e.to_string()))?;
        }
        for m in &s.pending_msis {
            if m.vector < 32 || m.dest as u32 >= self.vcpus || m.remaining_ns > MAX_MSI_DELAY_NS {
                return Err(StateError::unfit(
                    DEVICE,
                    format!("a saved MSI is out of range: {m:?}"),
                ));
            }
            let msi = self.msi.as_ref().ok_or_else(|| {
                StateError::unfit(DEVICE, "saved MSIs for a VM without an MSI injector")
            })?;
            // Zero would inject at once, before the vCPUs' state is loaded.
            let delay = Duration::from_nanos(m.remaining_ns.max(1));
            msi.inject_after(m.dest, m.vector, delay)
                .map_err(|source| StateError::Msi {
                    device: DEVICE.into(),
                    source,
                })?;
        }
        Ok(())
    }

    /// The `len` guest bytes at `gpa` (`None`: not all in guest RAM). The
    /// caller bounds `len` first: it comes from the guest.
    fn read_guest(&self, gpa: u64, len: usize) -> Option<Vec<u8>> {
        let mut raw = vec![0u8; len];
        self.guest
            .memory()
            .read_slice(&mut raw, GuestAddress(gpa))
            .ok()
            .map(|()| raw)
    }

    /// Carry out the request at `gpa` for vCPU `vcpu`.
    pub fn handle(&self, vcpu: usize, gpa: u64) -> ControlAction {
        let mut raw = [0u8; REQUEST_SIZE];
        if self
            .guest
            .memory()
            .read_slice(&mut raw, GuestAddress(gpa))
            .is_err()
        {
            tracing::warn!(
                vcpu,
                "control request at {gpa:#x} lies outside guest RAM; ignored"
            );
            return ControlAction::Continue;
        }
        let req = decode_request(&raw);
        let (st, action) = match req.op {
            op::EXIT => match u32::try_from(req.arg0) {
                Ok(code) => (status::OK, ControlAction::Exit(code)),
                Err(_) => (status::BAD_RANGE, ControlAction::Continue),
            },
            op::REPORT => (
                self.report(vcpu, req.arg0, req.arg1),
                ControlAction::Continue,
            ),
            op::LOG => (self.log(vcpu, req.arg0, req.arg1), ControlAction::Continue),
            op::INJECT_MSI => (self.inject_msi(req.arg0, req.arg1), ControlAction::Continue),
            op::IO_SETUP => match &self.pvio {
                Some(d) => (d.setup(req.arg0, req.arg1), ControlAction::Continue),
                None => (status::BAD_OP, ControlAction::Continue),
            },
            op::BOOST_REGISTER => match &self.booster {
                Some(b) => (
                    b.register(vcpu, req.arg0, req.arg1),
                    ControlAction::Continue,
                ),
                None => (status::UNAVAILABLE, ControlAction::Continue),
            },
            op::BOOST_UNBOOST => match &self.booster {
                Some(b) => (b.unboost_call(vcpu), ControlAction::Continue),
                None => (status::UNAVAILABLE, ControlAction::Continue),
            },
            other => {
                tracing::warn!(vcpu, "control request with unknown op {other}");
                (status::BAD_OP, ControlAction::Continue)
            }
        };
        if st != status::OK {
            tracing::debug!(vcpu, op = req.op, status = st, "control request refused");
        }
        // The request was readable, so its status field is writable.
        let _ = self.guest.write_obj(st, gpa + STATUS_OFFSET);
        action
    }

    fn report(&self, vcpu: usize, gpa: u64, count: u64) -> u32 {
        if count > MAX_REPORTS_PER_REQUEST {
            return status::BAD_RANGE;
        }
        let Some(raw) = self.read_guest(gpa, count as usize * REPORT_SIZE) else {
            return status::BAD_RANGE;
        };
        let mut batch = Vec::with_capacity(count as usize);
        let kept = self.reports.locked().len();
        if kept as u64 + count > self.limits.reports as u64 {
            self.report_hit
                .hit("reports", "guest-reports-max", self.limits.reports);
            return status::BAD_RANGE;
        }
        for chunk in raw.chunks_exact(REPORT_SIZE) {
            let r = decode_report(chunk);
            let (Ok(key), Some(value)) = (r.key_str(), ReportValue::from_record(&r)) else {
                return status::BAD_RECORD;
            };
            batch.push(ReportEntry {
                vcpu,
                key: key.to_string(),
                value,
            });
        }
        self.reports.locked().extend(batch);
        status::OK
    }

    fn inject_msi(&self, target: u64, delay_ns: u64) -> u32 {
        let (vector, dest) = ((target & 0xff) as u8, ((target >> 8) & 0xff) as u8);
        // Vectors below 32 are exceptions; the upper bits must be clear.
        if vector < 32
            || dest as u32 >= self.vcpus
            || target >> 16 != 0
            || delay_ns > MAX_MSI_DELAY_NS
        {
            return status::BAD_RANGE;
        }
        if Duration::from_nanos(delay_ns) > self.limits.msi_delay {
            let limit = format!("{:?}", self.limits.msi_delay);
            self.msi_hit.hit("MSI delay", "guest-msi-max-delay", limit);
            return status::BAD_RANGE;
        }
        let Some(msi) = &self.msi else {
            return status::BAD_OP;
        };
        match msi.inject_after(dest, vector, Duration::from_nanos(delay_ns)) {
            Ok(()) => status::OK,
            Err(InjectError::Full(n)) => {
                self.msi_hit.hit("delayed MSIs", "guest-msi-max-pending", n);
                status::BAD_RANGE
            }
            Err(e) => {
                tracing::warn!("MSI {vector:#x} to vCPU {dest} failed: {e}");
                status::BAD_RANGE
            }
        }
    }

    fn log(&self, vcpu: usize, gpa: u64, len: u64) -> u32 {
        if len > MAX_LOG_LEN {
            return status::BAD_RANGE;
        }
        let before = self
            .logged
            .fetch_add(len, std::sync::atomic::Ordering::Relaxed);
        if before + len > self.limits.log_bytes {
            self.log_hit
                .hit("log bytes", "guest-log-max", self.limits.log_bytes);
            return status::BAD_RANGE;
        }
        let Some(raw) = self.read_guest(gpa, len as usize) else {
            return status::BAD_RANGE;
        };
        match std::str::from_utf8(&raw) {
            Ok(msg) => {
                tracing::info!(target: "guest", vcpu, "{msg}");
                status::OK
            }
            Err(_) => status::BAD_RECORD,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> ControlDevice {
        ControlDevice::new(
            GuestWriter::unrecorded(
                vm_memory::GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap(),
            ),
            None,
            2,
        )
    }

    fn put_request(d: &ControlDevice, gpa: u64, r: ControlRequest) {
        let mut b = Vec::new();
        b.extend(r.op.to_le_bytes());
        b.extend(r.status.to_le_bytes());
        b.extend(r.arg0.to_le_bytes());
        b.extend(r.arg1.to_le_bytes());
        d.guest.memory().write_slice(&b, GuestAddress(gpa)).unwrap();
    }

    fn put_report(d: &ControlDevice, gpa: u64, r: Report) {
        let mut b = r.key.to_vec();
        b.extend(r.kind.to_le_bytes());
        b.extend(r.reserved.to_le_bytes());
        b.extend(r.value.to_le_bytes());
        d.guest.memory().write_slice(&b, GuestAddress(gpa)).unwrap();
    }

    fn status_at(d: &ControlDevice, gpa: u64) -> u32 {
        d.guest
            .memory()
            .read_obj(GuestAddress(gpa + STATUS_OFFSET))
            .unwrap()
    }

    /// Put a request at 0x1000, handle it for vCPU 0: the action and the status.
    fn request(d: &ControlDevice, op: u32, arg0: u64, arg1: u64) -> (ControlAction, u32) {
        put_request(
            d,
            0x1000,
            ControlRequest {
                op,
                status: 0,
                arg0,
                arg1,
            },
        );
        let action = d.handle(0, 0x1000);
        (action, status_at(d, 0x1000))
    }

    #[test]
    fn exit_and_reports() {
        let d = setup();
        put_report(&d, 0x2000, Report::u64("vcpus_seen", 2));
        put_report(&d, 0x2030, Report::i64("delta", -5));
        put_request(
            &d,
            0x1000,
            ControlRequest {
                op: op::REPORT,
                status: 0,
                arg0: 0x2000,
                arg1: 2,
            },
        );
        assert_eq!(d.handle(1, 0x1000), ControlAction::Continue);
        assert_eq!(status_at(&d, 0x1000), status::OK);
        let r = d.reports();
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[0].vcpu, r[0].key.as_str(), r[0].value),
            (1, "vcpus_seen", ReportValue::U64(2))
        );
        assert_eq!(r[1].value, ReportValue::I64(-5));
        assert_eq!(
            request(&d, op::EXIT, 7, 0),
            (ControlAction::Exit(7), status::OK)
        );
    }

    /// Random requests at random addresses: never a panic, and a status
    /// written only where a request could be read.
    #[test]
    fn random_requests_never_panic() {
        let d = setup();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let gpa = next() % (2 << 20);
            let pick = |v: u64, small: u64| if v.is_multiple_of(3) { v } else { v % small };
            let req = ControlRequest {
                op: (next() % 8) as u32,
                status: 0,
                arg0: pick(next(), 1 << 21),
                arg1: pick(next(), 2048),
            };
            if gpa + 24 <= 1 << 20 {
                put_request(&d, gpa, req);
            }
            let _ = d.handle((next() % 4) as usize, gpa);
        }
    }

    #[test]
    fn bad_requests_change_nothing() {
        let d = setup();
        let refused = |op, arg0, arg1| request(&d, op, arg0, arg1);
        // A request outside RAM is ignored.
        assert_eq!(d.handle(0, 0x10_0000 - 8), ControlAction::Continue);
        assert_eq!(refused(99, 0, 0).1, status::BAD_OP);
        // Too many records, records outside RAM, a bad key: refused whole.
        assert_eq!(
            refused(op::REPORT, 0x2000, MAX_REPORTS_PER_REQUEST + 1).1,
            status::BAD_RANGE
        );
        assert_eq!(refused(op::REPORT, 0xf_fff0, 1).1, status::BAD_RANGE);
        put_report(&d, 0x2000, Report::u64("good", 1));
        put_report(&d, 0x2030, Report::u64("Bad Key", 1));
        assert_eq!(refused(op::REPORT, 0x2000, 2).1, status::BAD_RECORD);
        assert!(
            d.reports().is_empty(),
            "a batch with one bad record is refused whole"
        );
        // An exit code wider than 32 bits does not exit.
        assert_eq!(
            refused(op::EXIT, 1 << 40, 0),
            (ControlAction::Continue, status::BAD_RANGE)
        );
        // Log: too long, and not UTF-8.
        assert_eq!(
            refused(op::LOG, 0x3000, MAX_LOG_LEN + 1).1,
            status::BAD_RANGE
        );
        d.guest
            .memory()
            .write_slice(&[0xff, 0xfe], GuestAddress(0x3000))
            .unwrap();
        assert_eq!(refused(op::LOG, 0x3000, 2).1, status::BAD_RECORD);
        // MSI requests: bad vector, bad vCPU, too long a delay; no injector.
        assert_eq!(refused(op::INJECT_MSI, 0x10, 0).1, status::BAD_RANGE);
        assert_eq!(
            refused(op::INJECT_MSI, 0x50 | 2 << 8, 0).1,
            status::BAD_RANGE
        );
        assert_eq!(
            refused(op::INJECT_MSI, 0x50, MAX_MSI_DELAY_NS + 1).1,
            status::BAD_RANGE
        );
        assert_eq!(refused(op::INJECT_MSI, 0x50, 0).1, status::BAD_OP);
    }

    #[test]
    fn user_limits_refuse_reports_logs_and_msi_delays_past_them() {
        let d = setup().with_limits(GuestLimits {
            reports: 3,
            log_bytes: 10,
            msi_delay: Duration::from_millis(1),
            ..Default::default()
        });
        for i in 0..3u64 {
            put_report(&d, 0x2000 + i * 0x30, Report::u64("r", i));
        }
        assert_eq!(request(&d, op::REPORT, 0x2000, 2).1, status::OK);
        // Two more would make four: refused whole, the kept two unchanged.
        assert_eq!(request(&d, op::REPORT, 0x2000, 2).1, status::BAD_RANGE);
        assert_eq!(request(&d, op::REPORT, 0x2000, 1).1, status::OK);
        assert_eq!(d.reports().len(), 3);
        assert_eq!(request(&d, op::REPORT, 0x2000, 1).1, status::BAD_RANGE);

        d.guest
            .memory()
            .write_slice(b"12345678", GuestAddress(0x3000))
            .unwrap();
        assert_eq!(request(&d, op::LOG, 0x3000, 8).1, status::OK);
        assert_eq!(request(&d, op::LOG, 0x3000, 3).1, status::BAD_RANGE);

        // Within the ABI's 10 s but past the user's 1 ms.
        assert_eq!(
            request(&d, op::INJECT_MSI, 0x50, 2_000_000).1,
            status::BAD_RANGE
        );
        // Within the limit, it gets as far as the (missing) injector.
        assert_eq!(
            request(&d, op::INJECT_MSI, 0x50, 1_000_000).1,
            status::BAD_OP
        );
    }
}
