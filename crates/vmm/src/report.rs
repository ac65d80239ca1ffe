//! Results the guest reports through the control port, as the host keeps them.

use std::fmt;

use hover_abi::control::{value_kind, Report};
use serde::Serialize;

/// A reported value.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ReportValue {
    /// Unsigned integer.
    U64(u64),
    /// Signed integer.
    I64(i64),
    /// Floating point.
    F64(f64),
}

impl ReportValue {
    /// Decode a record's value, or `None` for an unknown kind.
    pub fn from_record(r: &Report) -> Option<Self> {
        Self::from_raw(r.kind, r.value)
    }

    /// The ABI's encoding of the value: (kind, bits), as in a [`Report`].
    pub fn to_raw(self) -> (u32, u64) {
        match self {
            ReportValue::U64(v) => (value_kind::U64, v),
            ReportValue::I64(v) => (value_kind::I64, v as u64),
            ReportValue::F64(v) => (value_kind::F64, v.to_bits()),
        }
    }

    /// The value from the ABI's encoding, or `None` for an unknown kind.
    pub fn from_raw(kind: u32, bits: u64) -> Option<Self> {
        match kind {
            value_kind::U64 => Some(ReportValue::U64(bits)),
            value_kind::I64 => Some(ReportValue::I64(bits as i64)),
            value_kind::F64 => Some(ReportValue::F64(f64::from_bits(bits))),
            _ => None,
        }
    }

    /// The value as an unsigned integer, if it is one.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            ReportValue::U64(v) => Some(v),
            ReportValue::I64(v) => u64::try_from(v).ok(),
            ReportValue::F64(_) => None,
        }
    }
}

impl fmt::Display for ReportValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReportValue::U64(v) => write!(f, "{v}"),
            ReportValue::I64(v) => write!(f, "{v}"),
            ReportValue::F64(v) => write!(f, "{v}"),
        }
    }
}

/// One report, with the vCPU that sent it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReportEntry {
    /// The vCPU that made the request.
    pub vcpu: usize,
    /// The key.
    pub key: String,
    /// The value.
    pub value: ReportValue,
}

/// Find the first report called `key` (from any vCPU).
pub fn find<'a>(reports: &'a [ReportEntry], key: &str) -> Option<&'a ReportEntry> {
    reports.iter().find(|r| r.key == key)
}
