//! Boosting settings (`--boost`, `--vcpu-rt`, `--boost-*`, `PUT /vm/boost`)
//! and the figures a run reports.

use serde::{Deserialize, Serialize};

use super::BoostPolicy;

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
            // A rogue guest holding its request kept the host probe from
            // its CPU for 50 ms at a time with 50 (`hover bench boost`);
            // legitimate boosts here use under 1 ms each.
            max_ms: 10,
            cooldown_ms: 100,
            max_rate: 5000,
            poll_us: 1000,
        }
    }
}

impl BoostConfig {
    /// Every value in range, or a sentence naming the flag that is not.
    pub fn check(&self) -> Result<(), String> {
        self.policy
            .check()
            .map_err(|e| format!("--boost-policy: {e}"))?;
        let range = |flag: &str, v: u64, lo: u64, hi: u64| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(format!("{flag} {v} is out of range: give {lo} to {hi}"))
            }
        };
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
}

/// A live change of the settings (`PUT /vm/boost`): what is absent stays.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoostUpdate {
    /// `off`, `dynamic` or `static`.
    pub mode: Option<BoostMode>,
    /// `fifo[:PRIO]` or `nice[:VALUE]`.
    pub policy: Option<String>,
    /// As `--boost-max-ms`.
    pub max_ms: Option<u64>,
    /// As `--boost-cooldown-ms`.
    pub cooldown_ms: Option<u64>,
    /// As `--boost-max-rate`.
    pub max_rate: Option<u32>,
    /// As `--boost-poll-us`.
    pub poll_us: Option<u64>,
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
            let field = ["max_ms", "cooldown_ms", "max_rate", "poll_us", "policy"]
                .into_iter()
                .find(|f| e.contains(&f.replace('_', "-")))
                .unwrap_or("body");
            (field, e)
        })?;
        Ok(c)
    }
}

/// One vCPU's boosting figures (outcome, `GET /vm/stats`, metrics).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct VcpuBoostStats {
    /// The guest registered a shared area for this vCPU.
    pub registered: bool,
    /// Boosts granted.
    pub boosts: u64,
    /// ... because request bits were set.
    pub boosts_request: u64,
    /// ... because an interrupt was injected.
    pub boosts_interrupt: u64,
    /// ... because an announced real-time wake-up was due.
    pub boosts_timer: u64,
    /// Of those, boosts granted after the wake-up was already due (the
    /// monitor learned of it late).
    pub late_timer_boosts: u64,
    /// Boosts ended by the guest's unboost call.
    pub unboosts: u64,
    /// Boosts revoked by the throttle.
    pub throttles: u64,
    /// Wall time spent boosted, microseconds.
    pub boosted_us: u64,
    /// Boosts the OS refused (no privilege, say).
    pub errors: u64,
}

/// The whole VM's boosting figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct BoostReport {
    /// `off`, `dynamic` or `static`.
    pub mode: BoostMode,
    /// The policy, as `fifo:PRIO` or `nice:VALUE`.
    pub policy: String,
    /// Per vCPU.
    pub vcpus: Vec<VcpuBoostStats>,
}
