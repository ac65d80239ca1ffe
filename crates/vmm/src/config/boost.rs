//! vCPU priority boosting's settings (`--boost`, `--vcpu-rt`, `--boost-*`,
//! `PUT /vm/boost`): which boosting, what a boost does to a thread, and the
//! throttle that bounds what a guest can take. The monitor that acts on
//! them is `sched::boost`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::range::RangeError;

/// SCHED_FIFO priority used by `fifo` without a value.
pub const DEFAULT_FIFO_PRIO: i32 = 10;
/// Nice value used by `nice` without a value.
pub const DEFAULT_NICE: i32 = -20;
/// Default `--boost-max-ms`: a rogue guest holding its request kept the
/// host probe from its CPU for 50 ms at a time with 50 (`hover bench
/// boost`); legitimate boosts here use under 1 ms each.
pub const DEFAULT_MAX_MS: u64 = 10;
/// Default `--boost-cooldown-ms`.
pub const DEFAULT_COOLDOWN_MS: u64 = 100;
/// Default `--boost-max-rate` (boosts per vCPU per second).
pub const DEFAULT_MAX_RATE: u32 = 5000;
/// Default `--boost-poll-us`.
pub const DEFAULT_POLL_US: u64 = 1000;

/// How a boosted thread is scheduled. In JSON (the API, `--json`) it is the
/// flag's text, `fifo:10` or `nice:-20`, everywhere; in the binary formats
/// (snapshots, migration streams) the enum as before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoostPolicy {
    /// SCHED_FIFO at this priority (1-99): runs before every normal thread.
    Fifo(i32),
    /// SCHED_OTHER at this nice value (-20..19): a larger share, no precedence.
    Nice(i32),
}

/// The binary formats' encoding (variant index, value): unchanged from
/// when `BoostPolicy` derived it, so saved files and streams still read.
#[derive(Serialize, Deserialize)]
enum PolicyWire {
    Fifo(i32),
    Nice(i32),
}

impl Serialize for BoostPolicy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            return s.collect_str(self);
        }
        match *self {
            BoostPolicy::Fifo(p) => PolicyWire::Fifo(p),
            BoostPolicy::Nice(n) => PolicyWire::Nice(n),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for BoostPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if d.is_human_readable() {
            let text = String::deserialize(d)?;
            return text.parse().map_err(serde::de::Error::custom);
        }
        Ok(match PolicyWire::deserialize(d)? {
            PolicyWire::Fifo(p) => BoostPolicy::Fifo(p),
            PolicyWire::Nice(n) => BoostPolicy::Nice(n),
        })
    }
}

impl Default for BoostPolicy {
    fn default() -> Self {
        BoostPolicy::Fifo(DEFAULT_FIFO_PRIO)
    }
}

impl fmt::Display for BoostPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BoostPolicy::Fifo(p) => write!(f, "fifo:{p}"),
            BoostPolicy::Nice(n) => write!(f, "nice:{n}"),
        }
    }
}

impl FromStr for BoostPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, value) = match s.split_once(':') {
            Some((k, v)) => (k, Some(v)),
            None => (s, None),
        };
        let number = |v: &str, what: &str| {
            v.parse::<i32>()
                .map_err(|_| format!("{what} {v:?} is not a whole number"))
        };
        let policy = match (kind, value) {
            ("fifo", None) => BoostPolicy::Fifo(DEFAULT_FIFO_PRIO),
            ("fifo", Some(v)) => BoostPolicy::Fifo(number(v, "the SCHED_FIFO priority")?),
            ("nice", None) => BoostPolicy::Nice(DEFAULT_NICE),
            ("nice", Some(v)) => BoostPolicy::Nice(number(v, "the nice value")?),
            _ => {
                return Err(format!(
                    "unknown boost policy {s:?}: give fifo[:PRIO] (1-99) or nice[:VALUE] (-20..19)"
                ))
            }
        };
        policy.check().map_err(|e| e.to_string())?;
        Ok(policy)
    }
}

impl BoostPolicy {
    /// Whether the value is within what the OS accepts.
    pub fn check(&self) -> Result<(), RangeError> {
        match *self {
            BoostPolicy::Fifo(p) if !(1..=99).contains(&p) => Err(RangeError::Os {
                what: "SCHED_FIFO priority",
                value: p.into(),
                lo: 1,
                hi: 99,
            }),
            BoostPolicy::Nice(n) if !(-20..=19).contains(&n) => Err(RangeError::Os {
                what: "nice value",
                value: n.into(),
                lo: -20,
                hi: 19,
            }),
            _ => Ok(()),
        }
    }

    /// What the monitor thread itself runs at: one step above the boosted
    /// vCPUs, so that it acts on time under the load it protects them from.
    pub fn for_monitor(&self) -> BoostPolicy {
        match *self {
            BoostPolicy::Fifo(p) => BoostPolicy::Fifo((p + 1).min(99)),
            BoostPolicy::Nice(n) => BoostPolicy::Nice(n),
        }
    }
}

/// Which boosting a VM runs with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BoostMode {
    /// No boosting: vCPU threads stay as they were started (`--boost off`).
    #[default]
    Off,
    /// Guest-driven boosting through the shared areas (`--boost on`).
    Dynamic,
    /// Every vCPU thread boosted all the time (`--vcpu-rt`).
    Static,
}

impl FromStr for BoostMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(BoostMode::Off),
            "dynamic" => Ok(BoostMode::Dynamic),
            "static" => Ok(BoostMode::Static),
            _ => Err(format!(
                "unknown boost mode {s:?}: give off, dynamic or static"
            )),
        }
    }
}

/// Boosting settings (`--boost`, `--vcpu-rt`, `--boost-*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoostConfig {
    /// Off, dynamic or static.
    pub mode: BoostMode,
    /// What a boost does to a thread.
    pub policy: BoostPolicy,
    /// CPU time a boosted vCPU thread may use before its boost is revoked.
    pub max_ms: u64,
    /// How long no boost is granted after one was revoked.
    pub cooldown_ms: u64,
    /// Most boosts per vCPU in one second; one more revokes (a guest
    /// flipping its request bits as fast as it can).
    pub max_rate: u32,
    /// How often the monitor thread reads the shared areas.
    pub poll_us: u64,
}

impl Default for BoostConfig {
    fn default() -> Self {
        BoostConfig {
            mode: BoostMode::Off,
            policy: BoostPolicy::default(),
            max_ms: DEFAULT_MAX_MS,
            cooldown_ms: DEFAULT_COOLDOWN_MS,
            max_rate: DEFAULT_MAX_RATE,
            poll_us: DEFAULT_POLL_US,
        }
    }
}

impl BoostConfig {
    /// Every value in range, or a sentence naming the flag that is not.
    pub fn check(&self) -> Result<(), RangeError> {
        self.policy.check().map_err(|e| RangeError::InFlag {
            flag: "--boost-policy",
            inner: Box::new(e),
        })?;
        let range = RangeError::check;
        range("--boost-max-ms", self.max_ms, 1, 10_000)?;
        range("--boost-cooldown-ms", self.cooldown_ms, 0, 60_000)?;
        range("--boost-max-rate", self.max_rate as u64, 1, 100_000)?;
        range("--boost-poll-us", self.poll_us, 50, 1_000_000)
    }
}

impl BoostConfig {
    /// The settings as `PUT /vm/boost` answers them (policy as text).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "mode": self.mode,
            "policy": self.policy.to_string(),
            "max_ms": self.max_ms,
            "cooldown_ms": self.cooldown_ms,
            "max_rate": self.max_rate,
            "poll_us": self.poll_us,
        })
    }

    /// This setting with this host's `tuning`: boosting in the one shape
    /// the API shows it everywhere (`GET /vm`'s `config.boost`, `PUT
    /// /vm/boost`'s answer, `GET /vm/stats`' `boost` beside its figures),
    /// which is the shape `PUT /vm/boost` takes.
    pub fn with_tuning(&self, tuning: &BoostTuning) -> serde_json::Value {
        let mut v = self.to_json();
        v["when"] = tuning.when.to_string().into();
        v["keep_us"] = tuning.keep_us.into();
        v["irq_us"] = tuning.irq_us.into();
        v
    }
}

/// When a dynamic boost is granted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BoostWhen {
    /// Whenever the guest asks (or an interrupt or announced wake-up is due).
    #[default]
    Always,
    /// Only while the vCPU's thread has lately waited for a CPU (its
    /// run-queue wait, `/proc/.../schedstat`, grew): on an idle host a
    /// boost buys nothing and costs two system calls.
    Contended,
}

impl std::fmt::Display for BoostWhen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BoostWhen::Always => "always",
            BoostWhen::Contended => "contended",
        })
    }
}

impl FromStr for BoostWhen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "always" => Ok(BoostWhen::Always),
            "contended" => Ok(BoostWhen::Contended),
            _ => Err(format!(
                "unknown boost condition {s:?}: give always or contended"
            )),
        }
    }
}

/// How this host grants and keeps dynamic boosts (`--boost-when`,
/// `--boost-keep-us`): the host's choice, never saved with a VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoostTuning {
    /// When a boost is granted.
    pub when: BoostWhen,
    /// The guest's unboost call keeps the boost when its next announced
    /// real-time wake-up is due within this many microseconds (0: never)
    /// and, even if the vCPU ran flat out until then, the boost would stay
    /// within half of `--boost-max-ms` of CPU time: a periodic real-time
    /// task is not unboosted and boosted again around every short sleep,
    /// and no kept boost is revoked by the throttle. While non-zero, the
    /// guest's unboost is quiet (a write the monitor settles, no exit)
    /// where this covers its next wake-up or its vCPU halts.
    pub keep_us: u64,
    /// A host-side boost (an interrupt for a vCPU whose guest shares no
    /// boost area: a Linux guest) ends when the vCPU halts, or once its
    /// thread has run this many microseconds of CPU time since the boost.
    #[serde(default = "default_irq_us")]
    pub irq_us: u64,
}

/// `--boost-irq-us` by default: an interrupt handler and the task it wakes
/// take well under a millisecond of a CPU; a guest that computes on after
/// it gets back to the host's fair share within one.
pub const DEFAULT_IRQ_US: u64 = 1000;
/// The range of `--boost-irq-us`: at least one monitor look, at most a
/// tenth of a second (longer is `--vcpu-rt`'s business).
pub const IRQ_US_RANGE: std::ops::RangeInclusive<u64> = 50..=100_000;

fn default_irq_us() -> u64 {
    DEFAULT_IRQ_US
}

/// The longest gap a boost is kept across, microseconds.
pub const MAX_KEEP_US: u64 = 100_000;

/// `--boost-keep-us` by default. Measured against 0 (docs/BENCHMARKS.md,
/// 2026-11-26): the serial line on an idle host at 0.95x vanilla's speed
/// (0.77-0.91x without, in three runs: an unboost call per interrupt), the host probe's worst case
/// lower on a busy host, the timer's gain within the noise of 0's, and
/// 20-50x fewer boosts.
pub const DEFAULT_KEEP_US: u64 = 2000;

impl Default for BoostTuning {
    fn default() -> Self {
        BoostTuning {
            when: BoostWhen::default(),
            keep_us: DEFAULT_KEEP_US,
            irq_us: DEFAULT_IRQ_US,
        }
    }
}

impl BoostTuning {
    /// Every value in range, or a sentence naming the flag that is not.
    pub fn check(&self) -> Result<(), RangeError> {
        RangeError::check("--boost-keep-us", self.keep_us, 0, MAX_KEEP_US)?;
        RangeError::check(
            "--boost-irq-us",
            self.irq_us,
            *IRQ_US_RANGE.start(),
            *IRQ_US_RANGE.end(),
        )
    }
}

/// A live change of the settings (`PUT /vm/boost`; `hover ctl boost`
/// writes it): what is absent stays.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BoostUpdate {
    /// `off`, `dynamic` or `static`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<BoostMode>,
    /// `fifo[:PRIO]` or `nice[:VALUE]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// As `--boost-max-ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ms: Option<u64>,
    /// As `--boost-cooldown-ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cooldown_ms: Option<u64>,
    /// As `--boost-max-rate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_rate: Option<u32>,
    /// As `--boost-poll-us`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll_us: Option<u64>,
    /// As `--boost-when`: `always` or `contended`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub when: Option<BoostWhen>,
    /// As `--boost-keep-us`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_us: Option<u64>,
    /// As `--boost-irq-us`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub irq_us: Option<u64>,
}

impl BoostUpdate {
    /// `current` with this change, checked; or the field at fault and why.
    pub fn apply(&self, current: BoostConfig) -> Result<BoostConfig, (&'static str, String)> {
        let mut c = current;
        if let Some(m) = self.mode {
            c.mode = m;
        }
        if let Some(p) = &self.policy {
            c.policy = p.parse().map_err(|e| ("policy", e))?;
        }
        c.max_ms = self.max_ms.unwrap_or(c.max_ms);
        c.cooldown_ms = self.cooldown_ms.unwrap_or(c.cooldown_ms);
        c.max_rate = self.max_rate.unwrap_or(c.max_rate);
        c.poll_us = self.poll_us.unwrap_or(c.poll_us);
        c.check().map_err(|e| {
            let field = match e.flag() {
                Some("--boost-max-ms") => "max_ms",
                Some("--boost-cooldown-ms") => "cooldown_ms",
                Some("--boost-max-rate") => "max_rate",
                Some("--boost-poll-us") => "poll_us",
                Some("--boost-policy") => "policy",
                _ => "body",
            };
            (field, e.said_of(field))
        })?;
        Ok(c)
    }

    /// `current` tuning with this change, checked; or the field at fault
    /// and why.
    pub fn apply_tuning(
        &self,
        current: BoostTuning,
    ) -> Result<BoostTuning, (&'static str, String)> {
        let t = BoostTuning {
            when: self.when.unwrap_or(current.when),
            keep_us: self.keep_us.unwrap_or(current.keep_us),
            irq_us: self.irq_us.unwrap_or(current.irq_us),
        };
        t.check().map_err(|e| {
            let field = match e.flag() {
                Some("--boost-irq-us") => "irq_us",
                _ => "keep_us",
            };
            (field, e.said_of(field))
        })?;
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_one_policy_format_and_binary_formats_are_unchanged() {
        let p = BoostPolicy::Nice(-20);
        assert_eq!(serde_json::to_string(&p).unwrap(), "\"nice:-20\"");
        let back: BoostPolicy = serde_json::from_str("\"fifo:10\"").unwrap();
        assert_eq!(back, BoostPolicy::Fifo(10));
        assert!(serde_json::from_str::<BoostPolicy>("\"fifo:100\"").is_err());
        // Variant 1, then -20 as a zigzag varint: what the derive wrote.
        let bytes = postcard::to_allocvec(&p).unwrap();
        assert_eq!(bytes, [1, 39]);
        assert_eq!(postcard::from_bytes::<BoostPolicy>(&bytes).unwrap(), p);
    }

    #[test]
    fn policies_parse_with_defaults_and_ranges() {
        assert_eq!("fifo".parse(), Ok(BoostPolicy::Fifo(DEFAULT_FIFO_PRIO)));
        assert_eq!("fifo:50".parse(), Ok(BoostPolicy::Fifo(50)));
        assert_eq!("nice".parse(), Ok(BoostPolicy::Nice(-20)));
        assert_eq!("nice:-5".parse(), Ok(BoostPolicy::Nice(-5)));
        for bad in [
            "fifo:0", "fifo:100", "nice:-21", "nice:20", "rr", "fifo:x", "",
        ] {
            let e = bad.parse::<BoostPolicy>().unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
        assert!("fifo:100"
            .parse::<BoostPolicy>()
            .unwrap_err()
            .contains("1 to 99"));
        assert_eq!(BoostPolicy::Fifo(7).to_string(), "fifo:7");
        assert_eq!(BoostPolicy::Fifo(99).for_monitor(), BoostPolicy::Fifo(99));
    }

    #[test]
    fn tuning_parses_and_updates_live() {
        assert_eq!("contended".parse(), Ok(BoostWhen::Contended));
        assert!("sometimes".parse::<BoostWhen>().is_err());
        let u: BoostUpdate =
            serde_json::from_str(r#"{"when": "contended", "keep_us": 800}"#).unwrap();
        let t = u.apply_tuning(BoostTuning::default()).unwrap();
        assert_eq!(
            t,
            BoostTuning {
                when: BoostWhen::Contended,
                keep_us: 800,
                irq_us: DEFAULT_IRQ_US,
            }
        );
        let too_long = BoostUpdate {
            keep_us: Some(MAX_KEEP_US + 1),
            ..Default::default()
        };
        assert_eq!(too_long.apply_tuning(t).unwrap_err().0, "keep_us");
        for bad in [0, 49, 100_001] {
            let u = BoostUpdate {
                irq_us: Some(bad),
                ..Default::default()
            };
            let (field, e) = u.apply_tuning(t).unwrap_err();
            assert_eq!(field, "irq_us", "{e}");
            assert!(
                e.starts_with(&format!("irq_us {bad} is out of range")),
                "{e}"
            );
        }
        // A change that names none keeps them all.
        assert_eq!(BoostUpdate::default().apply_tuning(t).unwrap(), t);
    }
}
