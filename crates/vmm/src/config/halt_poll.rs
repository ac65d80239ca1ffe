//! Halt polling's setting (`--halt-poll-ns`, `--halt-poll auto`,
//! `PUT /vm/halt-poll`); `sched::halt_poll` applies it and runs the governor.

use serde::{Deserialize, Serialize};

/// Largest window accepted: 10 ms (KVM's own default maximum is 200 us).
pub const MAX_WINDOW_NS: u64 = 10_000_000;
/// The governor's CPU budget for failed polls, percent of one CPU per vCPU.
pub const DEFAULT_BUDGET_PCT: f64 = 2.5;

/// How halt polling is set for a VM. In JSON (`GET /vm`, `--json`) it has
/// the shape `PUT /vm/halt-poll` takes, `{"mode": "fixed", "window_ns":
/// N}`; in the binary formats (snapshots, migration streams) the enum as
/// the derive wrote it, so saved files still read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum HaltPoll {
    /// Leave KVM's default (its module parameter) alone.
    KvmDefault,
    /// A fixed maximum window, nanoseconds (0 = no polling).
    Fixed {
        /// The window.
        window_ns: u64,
    },
    /// The governor, with a CPU budget in percent of one CPU per vCPU.
    Auto {
        /// Budget for failed polls, in (0, 100].
        budget_pct: f64,
    },
}

/// The binary formats' encoding: what `HaltPoll` derived before.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum HaltPollWire {
    KvmDefault,
    Fixed { window_ns: u64 },
    Auto { budget_pct: f64 },
}

/// The JSON form: the mode and its one value.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HaltPollJson {
    mode: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    window_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    budget_pct: Option<f64>,
}

impl Serialize for HaltPoll {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            return self.to_json().serialize(s);
        }
        match *self {
            HaltPoll::KvmDefault => HaltPollWire::KvmDefault,
            HaltPoll::Fixed { window_ns } => HaltPollWire::Fixed { window_ns },
            HaltPoll::Auto { budget_pct } => HaltPollWire::Auto { budget_pct },
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for HaltPoll {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        if d.is_human_readable() {
            let j = HaltPollJson::deserialize(d)?;
            return match (j.mode.as_str(), j.window_ns, j.budget_pct) {
                // `kvm_default`: the spelling before the API's names
                // took the command line's (`hover ctl halt-poll --kvm-default`).
                ("kvm-default" | "kvm_default", None, None) => Ok(HaltPoll::KvmDefault),
                ("fixed", Some(window_ns), None) => Ok(HaltPoll::Fixed { window_ns }),
                ("auto", None, budget_pct) => Ok(HaltPoll::Auto {
                    budget_pct: budget_pct.unwrap_or(DEFAULT_BUDGET_PCT),
                }),
                _ => Err(D::Error::custom(
                    "halt polling is {\"mode\": \"kvm-default\"}, {\"mode\": \"fixed\", \"window_ns\": N} or {\"mode\": \"auto\", \"budget_pct\": P}",
                )),
            };
        }
        Ok(match HaltPollWire::deserialize(d)? {
            HaltPollWire::KvmDefault => HaltPoll::KvmDefault,
            HaltPollWire::Fixed { window_ns } => HaltPoll::Fixed { window_ns },
            HaltPollWire::Auto { budget_pct } => HaltPoll::Auto { budget_pct },
        })
    }
}

impl HaltPoll {
    /// The setting in the API's request form: `{"mode": "fixed",
    /// "window_ns": N}`, `{"mode": "auto", "budget_pct": P}` or
    /// `{"mode": "kvm-default"}`.
    pub fn to_json(self) -> serde_json::Value {
        match self {
            HaltPoll::KvmDefault => serde_json::json!({ "mode": "kvm-default" }),
            HaltPoll::Fixed { window_ns } => {
                serde_json::json!({ "mode": "fixed", "window_ns": window_ns })
            }
            HaltPoll::Auto { budget_pct } => {
                serde_json::json!({ "mode": "auto", "budget_pct": budget_pct })
            }
        }
    }
}

impl HaltPoll {
    /// Whether the values are in range, naming the flag that is not.
    pub fn check(&self) -> Result<(), super::ConfigError> {
        match *self {
            HaltPoll::Fixed { window_ns } if window_ns > MAX_WINDOW_NS => {
                Err(super::ConfigError::HaltPollTooLarge(window_ns))
            }
            HaltPoll::Auto { budget_pct } if !(budget_pct > 0.0 && budget_pct <= 100.0) => {
                Err(super::ConfigError::HaltPollBudget(budget_pct))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_the_requests_shape_and_binary_formats_are_unchanged() {
        for (h, text) in [
            (HaltPoll::KvmDefault, r#"{"mode":"kvm-default"}"#),
            (
                HaltPoll::Fixed { window_ns: 5000 },
                r#"{"mode":"fixed","window_ns":5000}"#,
            ),
            (
                HaltPoll::Auto { budget_pct: 2.5 },
                r#"{"budget_pct":2.5,"mode":"auto"}"#,
            ),
        ] {
            let json = serde_json::to_string(&h).unwrap();
            assert_eq!(serde_json::from_str::<HaltPoll>(&json).unwrap(), h);
            assert_eq!(serde_json::from_str::<HaltPoll>(text).unwrap(), h, "{text}");
        }
        assert_eq!(
            serde_json::from_str::<HaltPoll>(r#"{"mode":"kvm_default"}"#).unwrap(),
            HaltPoll::KvmDefault,
            "the older spelling is still read"
        );
        assert!(serde_json::from_str::<HaltPoll>(r#"{"fixed":{"window_ns":1}}"#).is_err());
        assert!(serde_json::from_str::<HaltPoll>(r#"{"mode":"fixed"}"#).is_err());
        // Variant 1, then 5000 as a varint: what the derive wrote.
        let bytes = postcard::to_allocvec(&HaltPoll::Fixed { window_ns: 5000 }).unwrap();
        assert_eq!(bytes, [1, 0x88, 0x27]);
        assert_eq!(
            postcard::from_bytes::<HaltPoll>(&bytes).unwrap(),
            HaltPoll::Fixed { window_ns: 5000 }
        );
    }
}
