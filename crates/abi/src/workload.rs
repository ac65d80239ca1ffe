//! The built-in guest's workloads and the parameters each accepts, with their
//! ranges and defaults.
//!
//! The monitor checks a command line against this table before it starts the
//! VM, so that a typo or an out-of-range value is a one-line error rather
//! than a failed guest run; the guest reads its parameters through the same
//! table, so defaults live in one place.

use crate::cmdline::{self, CmdlineError};

/// Workload run when the command line names none.
pub const DEFAULT_WORKLOAD: &str = "hello";

/// What values a parameter takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// An unsigned integer in `min..=max` (decimal or 0x hex).
    Number {
        /// Smallest accepted value.
        min: u64,
        /// Largest accepted value.
        max: u64,
        /// Value when the parameter is absent.
        default: u64,
    },
    /// A byte size in `min..=max`, as [`parse_size`] reads it (`64M`, `1G`).
    Size {
        /// Smallest accepted value.
        min: u64,
        /// Largest accepted value.
        max: u64,
        /// Value when the parameter is absent.
        default: u64,
    },
    /// One of a fixed set of words.
    Choice {
        /// The accepted words; the first is the default.
        values: &'static [&'static str],
    },
}

/// One command-line parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    /// The key.
    pub name: &'static str,
    /// What it means.
    pub help: &'static str,
    /// Accepted values.
    pub kind: ParamKind,
}

/// One workload.
#[derive(Clone, Copy, Debug)]
pub struct WorkloadSpec {
    /// The name given as `workload=NAME`.
    pub name: &'static str,
    /// One line on what it does and reports.
    pub help: &'static str,
    /// Parameters it accepts besides the global ones.
    pub params: &'static [ParamSpec],
}

const fn num(
    name: &'static str,
    help: &'static str,
    min: u64,
    max: u64,
    default: u64,
) -> ParamSpec {
    ParamSpec {
        name,
        help,
        kind: ParamKind::Number { min, max, default },
    }
}

/// Parameters every workload accepts.
pub const GLOBAL_PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "workload",
        help: "which workload to run",
        kind: ParamKind::Choice { values: &[] },
    },
    num(
        "hz",
        "scheduler tick (preemption) rate per vCPU",
        1,
        10_000,
        100,
    ),
    ParamSpec {
        name: "idle",
        help: "what an idle vCPU does: halt (HLT, exits to KVM), poll (spins in the guest) or haltpoll (polls for an adaptive window, then halts)",
        kind: ParamKind::Choice {
            values: &["halt", "poll", "haltpoll"],
        },
    },
    num(
        "poll_us",
        "idle=haltpoll: the longest poll window, microseconds (the monitor may allow less)",
        1,
        10_000,
        200,
    ),
    num(
        "apf_min_us",
        "keep async page faults on only while faults wait at least this long on average, microseconds (measured over 50 ms, re-measured after 1 s off); 0 keeps them on",
        0,
        1_000_000,
        0,
    ),
    ParamSpec {
        name: "virtio_mmio.device",
        help: "added by QEMU microvm for its virtio-mmio device: SIZE@BASE:GSI (iolat drives a virtio block device found this way when Hover's I/O device is absent)",
        kind: ParamKind::Choice { values: &[] },
    },
];

/// Every workload of the built-in guest.
pub const WORKLOADS: &[WorkloadSpec] = &[
    WorkloadSpec {
        name: "hello",
        help: "a task on every vCPU prints a greeting; reports vcpus_seen",
        params: &[],
    },
    WorkloadSpec {
        name: "spin",
        help: "tasks count loop iterations for a while; reports spin.task.N and spin.total",
        params: &[
            num("tasks", "number of spinning tasks, placed round the vCPUs", 1, 60, 4),
            num("seconds", "how long they spin", 1, 3600, 1),
        ],
    },
    WorkloadSpec {
        name: "memtouch",
        help: "tasks write a pattern over a buffer and verify it; reports pages, checksum, errors",
        params: &[
            ParamSpec {
                name: "size",
                help: "bytes to touch (K, M, G, T suffixes)",
                kind: ParamKind::Size { min: 4096, max: 64 << 30, default: 64 << 20 },
            },
            num("tasks", "tasks sharing the buffer", 1, 60, 1),
            num("seed", "pattern seed", 0, u64::MAX, 0x5eed),
            num("rounds", "write-and-verify passes (round r uses seed + r)", 1, 1_000_000, 1),
        ],
    },
    WorkloadSpec {
        name: "timer",
        help: "a task sleeps to periodic deadlines (like cyclictest); reports wake-up latency and a histogram",
        params: &[
            num("interval_us", "period between deadlines, microseconds", 10, 1_000_000, 1000),
            num("seconds", "how long to run", 1, 3600, 1),
            num("rt", "1: the task is real-time (asks for vCPU boosts, announces its wake-ups)", 0, 1, 0),
            num("background", "spinning tasks beside it (a busy guest)", 0, 16, 0),
        ],
    },
    WorkloadSpec {
        name: "audio",
        help: "a periodic real-time task must compute each buffer before the last one has played (the boosting seed's audio test); reports audio.glitches",
        params: &[
            num("buffer_ms", "buffer length and period, milliseconds", 1, 1000, 4),
            num("work_us", "computation per buffer, microseconds of an unloaded CPU", 1, 999_000, 500),
            num("seconds", "how long to play", 1, 3600, 5),
            num("rt", "1: the task is real-time (asks for vCPU boosts)", 0, 1, 1),
            num("background", "spinning tasks beside it (a busy guest)", 0, 16, 0),
        ],
    },
    WorkloadSpec {
        name: "critical",
        help: "test: a task enters critical sections (the boost request bit) and watches the boost status; reports critical.sections/boosted/throttled",
        params: &[
            num("count", "critical sections", 1, 100_000_000, 10),
            num("hold_us", "time spent in each, microseconds", 0, 60_000_000, 20_000),
            num("gap_us", "sleep between them, microseconds", 0, 60_000_000, 10_000),
            num("seconds", "end the run after this long (0: when count sections are done)", 0, 3600, 0),
        ],
    },
    WorkloadSpec {
        name: "ctxsw",
        help: "two tasks on vCPU 0 switch by yielding or by preemption; reports the cost per switch",
        params: &[
            ParamSpec { name: "mode", help: "yield or preempt", kind: ParamKind::Choice { values: &["yield", "preempt"] } },
            num("seconds", "how long to run", 1, 3600, 1),
        ],
    },
    WorkloadSpec {
        name: "nubcall",
        help: "times trips through the privileged nub (int3 -> CPL0 -> iretq); reports ns per trip",
        params: &[num("count", "number of trips", 1, 10_000_000, 10_000)],
    },
    WorkloadSpec {
        name: "irq",
        help: "asks the monitor for MSIs and waits for each in a task; reports delivery latency",
        params: &[
            num("count", "number of interrupts", 1, 1_000_000, 1000),
            num("delay_us", "delay the monitor waits before injecting", 0, 1_000_000, 100),
        ],
    },
    WorkloadSpec {
        name: "uart",
        help: "routes the serial port's line (GSI 4) to vCPU target, sends count bytes in loopback and a task there takes each one's interrupt; reports uart.received, uart.interrupts and latency",
        params: &[
            num("count", "bytes sent, one interrupt each", 1, 100_000, 200),
            num("target", "vCPU taking the interrupts (the last one if past it)", 0, 31, 1),
        ],
    },
    WorkloadSpec {
        name: "bm",
        help: "the async-PF seed's benchmark: faulting tasks write random pages of a prefaulted array, working tasks count; reports bm.worker.N, bm.work_total",
        params: &[
            num("faulting", "tasks writing random pages of the array", 0, 30, 4),
            num("working", "tasks incrementing a counter", 0, 30, 4),
            ParamSpec {
                name: "memory",
                help: "size of the array the faulting tasks write (K, M, G, T suffixes)",
                kind: ParamKind::Size { min: 1 << 20, max: 64 << 30, default: 256 << 20 },
            },
            num("seconds", "how long the tasks run (after prefaulting)", 1, 3600, 10),
            num("timeline_ms", "also report work per bucket of this many ms (bm.t.K; 0: off)", 0, 10_000, 0),
        ],
    },
    WorkloadSpec {
        name: "kvstore",
        help: "a key-value store over wss bytes: random verified writes at rate ops/s; reports kvstore.ops.K per 100 ms and kvstore.errors",
        params: &[
            ParamSpec {
                name: "wss",
                help: "working set: bytes of records (K, M, G, T suffixes)",
                kind: ParamKind::Size { min: 64 << 10, max: 64 << 30, default: 64 << 20 },
            },
            num("rate", "operations per second over all tasks (0: as fast as possible)", 0, 1_000_000_000, 0),
            num("tasks", "tasks, each with its own keys", 1, 16, 2),
            num("seconds", "how long it runs", 1, 3600, 5),
        ],
    },
    WorkloadSpec {
        name: "iolat",
        help: "queue-depth-1 synchronous writes through the paravirtual I/O device; reports IOPS and latency avg/p50/p99",
        params: &[
            ParamSpec {
                name: "size",
                help: "bytes per write (K suffix allowed)",
                kind: ParamKind::Size { min: 512, max: 1 << 20, default: 4096 },
            },
            num("seconds", "how long to write", 1, 3600, 5),
            num(
                "idle_ms",
                "then stay idle this long, in sleeps longer than the idle=haltpoll window (its window collapses); reports the windows before",
                0,
                60_000,
                0,
            ),
        ],
    },
    WorkloadSpec {
        name: "pingpong",
        help: "tasks on vCPU 0 and the last vCPU wake each other through events; reports the round trip",
        params: &[num("rounds", "number of round trips", 1, 10_000_000, 10_000)],
    },
    WorkloadSpec {
        name: "evict-report",
        help: "test: a report batch in pageable memory is evicted (by touching `size` bytes) before the monitor reads it",
        params: &[ParamSpec {
            name: "size",
            help: "bytes to touch after writing the batch (more than the memory budget)",
            kind: ParamKind::Size { min: 1 << 20, max: 64 << 30, default: 64 << 20 },
        }],
    },
    WorkloadSpec {
        name: "exception",
        help: "test: vCPU 0 raises an exception (`ud2`, or reads an unmapped address); the guest must print it and exit with code 19",
        params: &[ParamSpec {
            name: "kind",
            help: "ud (invalid opcode) or pf (a page fault in preemptible code)",
            kind: ParamKind::Choice { values: &["ud", "pf"] },
        }],
    },
    WorkloadSpec {
        name: "panic",
        help: "test: the main task panics; the guest must print the message and exit with code 18",
        params: &[],
    },
    WorkloadSpec {
        name: "triple-fault",
        help: "test: vCPU 0 triple-faults on purpose (the VM must stop with a register dump)",
        params: &[],
    },
];

/// The workload called `name`.
pub fn find(name: &str) -> Option<&'static WorkloadSpec> {
    WORKLOADS.iter().find(|w| w.name == name)
}

/// Why a command line was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkloadError<'a> {
    /// A syntax error.
    Syntax(CmdlineError<'a>),
    /// `workload=` names no known workload.
    UnknownWorkload(&'a str),
    /// A key the chosen workload does not accept.
    UnknownParam {
        /// The workload.
        workload: &'static str,
        /// The key.
        key: &'a str,
    },
    /// A value outside what its parameter accepts.
    BadValue {
        /// The parameter.
        param: &'static ParamSpec,
        /// The value given.
        value: &'a str,
    },
}

/// Parse a size: a count (decimal, or hexadecimal after `0x`) with an
/// optional binary unit K, M, G or T, any case, which may be followed by
/// `iB` or `B` (`512M` = `512MiB` = `512MB`); a decimal count may end in
/// `B` (a hexadecimal one cannot: `0xab` is a count). Spaces between the
/// count and the unit are allowed (`256 M`). The one reading of a size,
/// for workload parameters and the monitor's command line alike.
pub fn parse_size(v: &str) -> Option<u64> {
    let unit = |c: u8| match c.to_ascii_lowercase() {
        b'k' => Some(10),
        b'm' => Some(20),
        b'g' => Some(30),
        b't' => Some(40),
        _ => None,
    };
    let b = v.as_bytes();
    let mut end = b.len();
    if end > 0 && b[end - 1].eq_ignore_ascii_case(&b'b') {
        if end >= 3 && b[end - 2].eq_ignore_ascii_case(&b'i') && unit(b[end - 3]).is_some() {
            end -= 2;
        } else if (end >= 2 && unit(b[end - 2]).is_some()) || !v.starts_with("0x") {
            // ("0xab" is a hexadecimal count, not 0xa bytes.)
            end -= 1;
        }
    }
    let (digits, shift) = match end.checked_sub(1).and_then(|i| unit(b[i])) {
        Some(shift) => (&v[..end - 1], shift),
        None => (&v[..end], 0),
    };
    cmdline::parse_u64(digits.trim())?.checked_mul(1u64 << shift)
}

impl ParamSpec {
    /// Whether `value` is acceptable.
    pub fn accepts(&self, value: &str) -> bool {
        match self.kind {
            ParamKind::Number { min, max, .. } => {
                cmdline::parse_u64(value).is_some_and(|n| n >= min && n <= max)
            }
            ParamKind::Size { min, max, .. } => {
                parse_size(value).is_some_and(|n| n >= min && n <= max)
            }
            // An empty list (the `workload` key) is checked by `resolve`.
            ParamKind::Choice { values } => values.is_empty() || values.contains(&value),
        }
    }

    /// The numeric value in `cmdline` (or the default). Call after [`resolve`] succeeded.
    pub fn number(&self, cmdline: &str) -> u64 {
        let given = cmdline::get(cmdline, self.name);
        match self.kind {
            ParamKind::Number { default, .. } => {
                given.and_then(cmdline::parse_u64).unwrap_or(default)
            }
            ParamKind::Size { default, .. } => given.and_then(parse_size).unwrap_or(default),
            ParamKind::Choice { .. } => 0,
        }
    }

    /// The word in `cmdline` (or the default). Call after [`resolve`] succeeded.
    pub fn choice<'a>(&self, cmdline: &'a str) -> &'a str {
        match self.kind {
            ParamKind::Choice { values } => cmdline::get(cmdline, self.name)
                .or(values.first().copied())
                .unwrap_or(""),
            _ => "",
        }
    }
}

/// The global parameter called `name`.
pub fn global(name: &str) -> &'static ParamSpec {
    GLOBAL_PARAMS
        .iter()
        .find(|p| p.name == name)
        .expect("a global parameter of this table")
}

impl WorkloadSpec {
    /// This workload's parameter called `name`.
    pub fn param(&self, name: &str) -> &'static ParamSpec {
        let params: &'static [ParamSpec] = self.params;
        params
            .iter()
            .find(|p| p.name == name)
            .expect("a parameter of this workload")
    }
}

/// Check `cmdline` and return the workload it selects.
pub fn resolve(cmdline: &str) -> Result<&'static WorkloadSpec, WorkloadError<'_>> {
    cmdline::check_syntax(cmdline).map_err(WorkloadError::Syntax)?;
    let name = cmdline::get(cmdline, "workload").unwrap_or(DEFAULT_WORKLOAD);
    let spec = find(name).ok_or(WorkloadError::UnknownWorkload(name))?;
    for (key, value) in cmdline::pairs(cmdline).filter_map(Result::ok) {
        let param = GLOBAL_PARAMS
            .iter()
            .chain(spec.params)
            .find(|p| p.name == key)
            .ok_or(WorkloadError::UnknownParam {
                workload: spec.name,
                key,
            })?;
        if !param.accepts(value) {
            return Err(WorkloadError::BadValue { param, value });
        }
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_hello() {
        assert_eq!(resolve("").unwrap().name, "hello");
        assert_eq!(
            resolve("workload=hello hz=250 idle=poll").unwrap().name,
            "hello"
        );
    }

    #[test]
    fn unknown_names_keys_and_values() {
        assert_eq!(
            resolve("workload=nope").unwrap_err(),
            WorkloadError::UnknownWorkload("nope")
        );
        assert_eq!(
            resolve("workload=hello bogus=1").unwrap_err(),
            WorkloadError::UnknownParam {
                workload: "hello",
                key: "bogus"
            }
        );
        for bad in [
            "hz=0",
            "hz=fast",
            "idle=sleep",
            "workload=spin tasks=61",
            "workload=memtouch size=1T",
        ] {
            assert!(
                matches!(resolve(bad), Err(WorkloadError::BadValue { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn values_and_defaults() {
        let c = "workload=memtouch size=128M";
        let w = resolve(c).unwrap();
        assert_eq!(w.param("size").number(c), 128 << 20);
        assert_eq!(w.param("tasks").number(c), 1);
        assert_eq!(global("hz").number(c), 100);
        assert_eq!(global("idle").choice(c), "halt");
        assert_eq!(global("idle").choice("idle=poll"), "poll");
        assert_eq!(parse_size("4k"), Some(4096));
        for (text, n) in [
            ("4096", 4096),
            ("4096B", 4096),
            ("512MiB", 512 << 20),
            ("512mb", 512 << 20),
            ("1G", 1 << 30),
            ("2T", 2 << 40),
            ("0x1000", 4096),
            ("0xab", 0xab),
            ("0x10M", 16 << 20),
            ("256 M", 256 << 20),
        ] {
            assert_eq!(parse_size(text), Some(n), "{text}");
        }
        for bad in [
            "",
            "M",
            "MiB",
            "1.5G",
            "-1",
            "1X",
            "1iB",
            "0xM",
            "99999999999T",
        ] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }
}
