//! The control port: how the guest talks to the monitor.
//!
//! The guest fills a [`ControlRequest`] in its memory (below 4 GiB) and writes
//! the request's guest-physical address as a 32-bit value to [`CONTROL_PORT`]
//! (`out %eax, %dx`). The monitor handles the request during that I/O exit and
//! writes a [`status`] code back into the request before the guest continues.
//! Exits are expensive here (~31 us from CPL3), so guests batch reports.

/// The 32-bit I/O port of the control device.
pub const CONTROL_PORT: u16 = 0x600;
/// Reading 32 bits from [`CONTROL_PORT`] returns this value: the ABI revision.
pub const CONTROL_ABI_REVISION: u32 = 2;

/// Request operations.
pub mod op {
    /// Power off the VM; `arg0` = exit code.
    pub const EXIT: u32 = 1;
    /// Record results; `arg0` = gpa of a `[Report]` array, `arg1` = number of entries.
    pub const REPORT: u32 = 2;
    /// Log a UTF-8 message through the monitor's log; `arg0` = gpa, `arg1` = length.
    pub const LOG: u32 = 3;
    /// Ask the monitor to inject an MSI after a delay (a test and measurement
    /// aid for the guest's interrupt path): `arg0` = vector (bits 0-7) |
    /// destination vCPU (bits 8-15), `arg1` = delay in nanoseconds (at most
    /// [`super::MAX_MSI_DELAY_NS`]).
    pub const INJECT_MSI: u32 = 4;
    /// Set up the paravirtual I/O device's ring (`crate::pvio`): `arg0` =
    /// ring gpa, `arg1` = entries (a power of two up to `pvio::MAX_ENTRIES`).
    pub const IO_SETUP: u32 = 5;
    /// Register this vCPU's boost area (`crate::boost`): `arg0` = its gpa
    /// (64-byte aligned), `arg1` = [`crate::boost::BOOST_AREA_VERSION`].
    /// Hover accepts it in every boosting mode (boosting can be switched on
    /// live); [`super::status::UNAVAILABLE`] from a monitor without the feature.
    pub const BOOST_REGISTER: u32 = 6;
    /// The synchronous unboost: the guest's sensitive work has ended and
    /// its request bits are clear; the monitor unboosts this vCPU's thread
    /// (a no-op while any request bit is still set).
    pub const BOOST_UNBOOST: u32 = 7;
}

/// Longest delay an INJECT_MSI request may ask for: 10 s.
pub const MAX_MSI_DELAY_NS: u64 = 10_000_000_000;

/// Status codes the monitor writes into [`ControlRequest::status`].
pub mod status {
    /// Not handled yet (the guest writes this before ringing).
    pub const PENDING: u32 = 0;
    /// Done.
    pub const OK: u32 = 1;
    /// Unknown `op`.
    pub const BAD_OP: u32 = 2;
    /// An address or length points outside guest RAM, or a count exceeds its limit.
    pub const BAD_RANGE: u32 = 3;
    /// A record's contents are malformed (bad key, unknown value kind, not UTF-8).
    pub const BAD_RECORD: u32 = 4;
    /// The monitor has the feature switched off (for example `--boost off`).
    pub const UNAVAILABLE: u32 = 5;
}

/// Most [`Report`]s one request may carry.
pub const MAX_REPORTS_PER_REQUEST: u64 = 1024;
/// Longest message a LOG request may carry.
pub const MAX_LOG_LEN: u64 = 4096;
/// Longest report key in bytes (the key field is NUL-padded).
pub const REPORT_KEY_MAX: usize = 31;

/// One request, written by the guest, answered in place by the monitor.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ControlRequest {
    /// One of [`op`].
    pub op: u32,
    /// One of [`status`]; the guest sets [`status::PENDING`], the monitor answers.
    pub status: u32,
    /// First argument.
    pub arg0: u64,
    /// Second argument.
    pub arg1: u64,
}

/// Where [`ControlRequest`]'s fields sit, from the type.
pub mod request_offset {
    use super::ControlRequest;
    use core::mem::offset_of;
    /// [`ControlRequest::op`].
    pub const OP: usize = offset_of!(ControlRequest, op);
    /// [`ControlRequest::status`].
    pub const STATUS: usize = offset_of!(ControlRequest, status);
    /// [`ControlRequest::arg0`].
    pub const ARG0: usize = offset_of!(ControlRequest, arg0);
    /// [`ControlRequest::arg1`].
    pub const ARG1: usize = offset_of!(ControlRequest, arg1);
}

/// How a [`Report`]'s `value` is to be read.
pub mod value_kind {
    /// Unsigned 64-bit integer.
    pub const U64: u32 = 1;
    /// Signed 64-bit integer (two's complement).
    pub const I64: u32 = 2;
    /// IEEE-754 double, bit pattern.
    pub const F64: u32 = 3;
}

/// One key/value result record.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    /// ASCII key (`[a-z0-9_.]`), NUL-padded; at most [`REPORT_KEY_MAX`] bytes.
    pub key: [u8; 32],
    /// One of [`value_kind`].
    pub kind: u32,
    /// Zero.
    pub reserved: u32,
    /// The value, to be read according to `kind`.
    pub value: u64,
}

/// Where [`Report`]'s fields sit, from the type.
pub mod report_offset {
    use super::Report;
    use core::mem::offset_of;
    /// [`Report::key`].
    pub const KEY: usize = offset_of!(Report, key);
    /// [`Report::kind`].
    pub const KIND: usize = offset_of!(Report, kind);
    /// [`Report::reserved`].
    pub const RESERVED: usize = offset_of!(Report, reserved);
    /// [`Report::value`].
    pub const VALUE: usize = offset_of!(Report, value);
}

/// Why a report key was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyError {
    /// Empty, or longer than [`REPORT_KEY_MAX`] bytes.
    Length,
    /// A byte outside `[a-z0-9_.]`, or bytes after the NUL padding began.
    Character,
}

impl Report {
    /// A record with `key` (truncated to [`REPORT_KEY_MAX`] bytes).
    pub fn new(key: &str, kind: u32, value: u64) -> Self {
        let mut k = [0u8; 32];
        let n = key.len().min(REPORT_KEY_MAX);
        k[..n].copy_from_slice(&key.as_bytes()[..n]);
        Report {
            key: k,
            kind,
            reserved: 0,
            value,
        }
    }

    /// An unsigned record.
    pub fn u64(key: &str, value: u64) -> Self {
        Self::new(key, value_kind::U64, value)
    }

    /// A signed record.
    pub fn i64(key: &str, value: i64) -> Self {
        Self::new(key, value_kind::I64, value as u64)
    }

    /// A floating-point record.
    pub fn f64(key: &str, value: f64) -> Self {
        Self::new(key, value_kind::F64, value.to_bits())
    }

    /// The key, checked: non-empty, `[a-z0-9_.]`, NUL padding only at the end.
    pub fn key_str(&self) -> Result<&str, KeyError> {
        let len = self
            .key
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.key.len());
        if len == 0 || len > REPORT_KEY_MAX {
            return Err(KeyError::Length);
        }
        if self.key[len..].iter().any(|&b| b != 0) {
            return Err(KeyError::Character);
        }
        let k = &self.key[..len];
        if !k
            .iter()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.'))
        {
            return Err(KeyError::Character);
        }
        // The check above admits only ASCII, so this cannot fail.
        core::str::from_utf8(k).map_err(|_| KeyError::Character)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout docs/ABI.md publishes: derived offsets, pinned here (a
    /// field that moves is an ABI break, not a refactor).
    #[test]
    fn layouts_are_the_published_ones() {
        use request_offset as q;
        assert_eq!([q::OP, q::STATUS, q::ARG0, q::ARG1], [0, 4, 8, 16]);
        assert_eq!(core::mem::size_of::<ControlRequest>(), 24);
        use report_offset as r;
        assert_eq!([r::KEY, r::KIND, r::RESERVED, r::VALUE], [0, 32, 36, 40]);
        assert_eq!(core::mem::size_of::<Report>(), 48);
    }

    #[test]
    fn key_round_trips() {
        let r = Report::u64("vcpus_seen", 2);
        assert_eq!(r.key_str(), Ok("vcpus_seen"));
    }

    #[test]
    fn bad_keys_are_refused() {
        assert_eq!(Report::u64("", 1).key_str(), Err(KeyError::Length));
        assert_eq!(Report::u64("Upper", 1).key_str(), Err(KeyError::Character));
        let mut r = Report::u64("ok", 1);
        r.key[5] = b'x';
        assert_eq!(r.key_str(), Err(KeyError::Character));
        let full = Report {
            key: [b'a'; 32],
            kind: value_kind::U64,
            reserved: 0,
            value: 0,
        };
        assert_eq!(full.key_str(), Err(KeyError::Length));
    }

    #[test]
    fn record_sizes_are_stable() {
        assert_eq!(core::mem::size_of::<ControlRequest>(), 24);
        assert_eq!(core::mem::size_of::<Report>(), 48);
    }
}
