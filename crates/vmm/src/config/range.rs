//! A setting outside what Hover or the OS accepts: the one error of
//! config/'s range checks (the guest limits, boosting), naming the flag so
//! the CLI and the API can say which of their fields is at fault.

/// A value out of its range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// A number outside `lo..=hi`.
    #[error("{flag} {value} is out of range: give {lo} to {hi}")]
    Outside {
        /// The flag, with its dashes.
        flag: &'static str,
        /// The value given.
        value: u64,
        /// The least accepted.
        lo: u64,
        /// The most accepted.
        hi: u64,
    },
    /// A size or count outside its range, said in words ("between 4K and
    /// 16G").
    #[error("{flag} must be {range}")]
    Limit {
        /// The flag, with its dashes.
        flag: &'static str,
        /// The range, in words.
        range: &'static str,
    },
    /// A scheduling value the OS does not accept.
    #[error("{what} {value} is out of range: the OS accepts {lo} to {hi}")]
    Os {
        /// What the value is ("SCHED_FIFO priority").
        what: &'static str,
        /// The value given.
        value: i64,
        /// The least the OS accepts.
        lo: i64,
        /// The most.
        hi: i64,
    },
    /// A flag whose value holds a part out of range (`--boost-policy
    /// fifo:120`).
    #[error("{flag}: {inner}")]
    InFlag {
        /// The flag.
        flag: &'static str,
        /// The part out of range.
        inner: Box<RangeError>,
    },
}

impl RangeError {
    /// The flag at fault, if the error names one.
    pub fn flag(&self) -> Option<&'static str> {
        match self {
            RangeError::Outside { flag, .. }
            | RangeError::Limit { flag, .. }
            | RangeError::InFlag { flag, .. } => Some(flag),
            RangeError::Os { .. } => None,
        }
    }

    /// The error said of `name` instead of the flag (an API request's
    /// field: `max_ms 0 is out of range: give 1 to 10000`).
    pub fn said_of(&self, name: &str) -> String {
        match self {
            RangeError::Outside { value, lo, hi, .. } => {
                format!("{name} {value} is out of range: give {lo} to {hi}")
            }
            RangeError::Limit { range, .. } => format!("{name} must be {range}"),
            RangeError::Os { .. } => format!("{name}: {self}"),
            RangeError::InFlag { inner, .. } => format!("{name}: {inner}"),
        }
    }

    /// `value` within `lo..=hi`, or the error naming `flag`.
    pub fn check(flag: &'static str, value: u64, lo: u64, hi: u64) -> Result<(), RangeError> {
        if (lo..=hi).contains(&value) {
            Ok(())
        } else {
            Err(RangeError::Outside {
                flag,
                value,
                lo,
                hi,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_names_its_flag_and_range() {
        let e = RangeError::check("--boost-max-ms", 0, 1, 10_000).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--boost-max-ms 0 is out of range: give 1 to 10000"
        );
        assert_eq!(e.flag(), Some("--boost-max-ms"));
        assert_eq!(
            e.said_of("max_ms"),
            "max_ms 0 is out of range: give 1 to 10000"
        );
        assert!(RangeError::check("--x", 5, 1, 5).is_ok());
        let os = RangeError::Os {
            what: "nice value",
            value: 40,
            lo: -20,
            hi: 19,
        };
        assert_eq!(os.flag(), None);
        let flagged = RangeError::InFlag {
            flag: "--boost-policy",
            inner: Box::new(os),
        };
        assert_eq!(
            flagged.to_string(),
            "--boost-policy: nice value 40 is out of range: the OS accepts -20 to 19"
        );
    }
}
