//! What the guest may make the host do (`--guest-*`): each quantity a
//! guest request can ask the monitor for (bytes of the I/O device's file,
//! MSI timers and their delays, reports kept, log volume) has a limit
//! here; `devices::limits` enforces them. The ABI constants
//! ([`hover_abi::control::MAX_MSI_DELAY_NS`],
//! [`hover_abi::pvio::MAX_FILE_BYTES`]) are the ceilings no flag can raise.

use std::time::Duration;

use hover_abi::control::MAX_MSI_DELAY_NS;
use hover_abi::pvio::MAX_FILE_BYTES;
use serde::Serialize;

use super::range::RangeError;

/// Highest `--guest-msi-max-pending`.
pub const MAX_PENDING_MSIS: u32 = 65_536;
/// Highest `--guest-reports-max`.
pub const MAX_REPORTS: u32 = 1 << 20;
/// Highest `--guest-log-max` (1 GiB).
pub const MAX_LOG_BYTES: u64 = 1 << 30;

/// Default `--guest-msi-max-pending`.
pub const DEFAULT_MSI_PENDING: u32 = 1024;
/// Default `--guest-reports-max`.
pub const DEFAULT_REPORTS: u32 = 65_536;
/// Default `--guest-log-max` (1 MiB; the flag's default reads "1M").
pub const DEFAULT_LOG_BYTES: u64 = 1 << 20;

/// The limits a host sets on what its guest may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GuestLimits {
    /// Largest offset + length an I/O request may reach in the device's
    /// file (`--guest-io-max`), at most [`MAX_FILE_BYTES`].
    pub io_file_bytes: u64,
    /// Longest delay of an INJECT_MSI request (`--guest-msi-max-delay`), at
    /// most [`MAX_MSI_DELAY_NS`].
    pub msi_delay: Duration,
    /// Most delayed MSIs waiting at once (`--guest-msi-max-pending`).
    pub msi_pending: u32,
    /// Most reports kept for the outcome (`--guest-reports-max`).
    pub reports: u32,
    /// Most bytes of guest log messages passed to the monitor's log over
    /// the run (`--guest-log-max`).
    pub log_bytes: u64,
}

impl Default for GuestLimits {
    fn default() -> Self {
        GuestLimits {
            io_file_bytes: MAX_FILE_BYTES,
            msi_delay: Duration::from_nanos(MAX_MSI_DELAY_NS),
            msi_pending: DEFAULT_MSI_PENDING,
            reports: DEFAULT_REPORTS,
            log_bytes: DEFAULT_LOG_BYTES,
        }
    }
}

impl GuestLimits {
    /// Why these limits cannot be used, naming the flag and its range.
    pub fn check(&self) -> Result<(), RangeError> {
        let range = |flag: &'static str, ok: bool, range: &'static str| {
            if ok {
                Ok(())
            } else {
                Err(RangeError::Limit { flag, range })
            }
        };
        range(
            "--guest-io-max",
            (4096..=MAX_FILE_BYTES).contains(&self.io_file_bytes),
            "between 4K and 16G",
        )?;
        range(
            "--guest-msi-max-delay",
            self.msi_delay <= Duration::from_nanos(MAX_MSI_DELAY_NS),
            "at most 10s",
        )?;
        range(
            "--guest-msi-max-pending",
            (1..=MAX_PENDING_MSIS).contains(&self.msi_pending),
            "between 1 and 65536",
        )?;
        range(
            "--guest-reports-max",
            (1..=MAX_REPORTS).contains(&self.reports),
            "between 1 and 1048576",
        )?;
        range(
            "--guest-log-max",
            self.log_bytes <= MAX_LOG_BYTES,
            "at most 1G",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_within_their_own_ranges() {
        assert_eq!(GuestLimits::default().check(), Ok(()));
    }

    #[test]
    fn each_out_of_range_limit_names_its_flag() {
        type Set = fn(&mut GuestLimits);
        let cases: [(Set, &str); 6] = [
            (|l| l.io_file_bytes = MAX_FILE_BYTES + 1, "--guest-io-max"),
            (|l| l.io_file_bytes = 100, "--guest-io-max"),
            (
                |l| l.msi_delay = Duration::from_secs(11),
                "--guest-msi-max-delay",
            ),
            (|l| l.msi_pending = 0, "--guest-msi-max-pending"),
            (|l| l.reports = MAX_REPORTS + 1, "--guest-reports-max"),
            (|l| l.log_bytes = MAX_LOG_BYTES + 1, "--guest-log-max"),
        ];
        for (set, flag) in cases {
            let mut l = GuestLimits::default();
            set(&mut l);
            let e = l.check().unwrap_err();
            assert!(e.to_string().starts_with(flag), "{e}");
            assert_eq!(e.flag(), Some(flag));
        }
    }
}
