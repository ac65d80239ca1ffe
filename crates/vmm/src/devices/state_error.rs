//! Why a device did not take up a saved state (a restore, a migration's
//! arrival). Each device's `restore` or `load_state` checks the whole
//! state before it changes anything, so a state refused leaves the device
//! as it was; the error names the device and what does not fit, for the
//! user to see beside the snapshot section it came from.

use crate::devices::msi::InjectError;

/// A saved device state refused.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The saved bytes do not decode, or the crate that models the device
    /// (vm-superio, virtio-queue) refuses the values.
    #[error("{device}: its saved state does not decode: {why}")]
    Decode {
        /// The device, as the user knows it ("serial port", "virtio net").
        device: String,
        /// The decoder's complaint.
        why: String,
    },
    /// The state decodes but does not fit this device or VM (another
    /// device type, another queue count, a value out of range).
    #[error("{device}: {why}")]
    Unfit {
        /// The device.
        device: String,
        /// What does not fit, with both values.
        why: String,
    },
    /// The host refused something taking the state up needs.
    #[error("{device}: {what}: {source}")]
    Host {
        /// The device.
        device: String,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A saved MSI could not be armed again.
    #[error("{device}: a saved MSI could not be armed again: {source}")]
    Msi {
        /// The device.
        device: String,
        /// Why the injector refused it.
        source: InjectError,
    },
}

impl StateError {
    /// `why` does not fit `device`.
    pub fn unfit(device: impl Into<String>, why: impl Into<String>) -> Self {
        StateError::Unfit {
            device: device.into(),
            why: why.into(),
        }
    }

    /// `device`'s saved state does not decode: `why`.
    pub fn decode(device: impl Into<String>, why: impl std::fmt::Display) -> Self {
        StateError::Decode {
            device: device.into(),
            why: why.to_string(),
        }
    }
}
