//! `hover bench <scenario>`: the scenarios' flags (`scenarios.rs`),
//! checked, and their run.

mod scenarios;

use std::process::ExitCode;

pub use scenarios::BenchArgs;
use scenarios::{BoostArgs, BoostHost, BoostTest, Device, MigrateArgs, Peer, Scenario};

use crate::{die_on_broken_pipe, fail, EXIT_BAD_INPUT, EXIT_HOST_FAILURE};

/// Which flags the user gave on the scenario's command line (not their
/// defaults): a flag the chosen scenario or mode would ignore is refused.
pub struct Given(Vec<String>);

impl Given {
    /// The flags given to `hover bench <scenario>` in `matches` (the whole
    /// command line's).
    pub fn of(matches: &clap::ArgMatches) -> Given {
        let Some((_, scenario)) = matches
            .subcommand_matches("bench")
            .and_then(clap::ArgMatches::subcommand)
        else {
            return Given(Vec::new());
        };
        Given(
            scenario
                .ids()
                .filter(|id| {
                    scenario.value_source(id.as_str())
                        == Some(clap::parser::ValueSource::CommandLine)
                })
                .map(|id| id.as_str().to_string())
                .collect(),
        )
    }

    /// The first of `ids` given, as its flag (`link_mbit`: `--link-mbit`).
    fn any(&self, ids: &[&str]) -> Option<String> {
        ids.iter()
            .find(|id| self.0.iter().any(|g| g == *id))
            .map(|id| format!("--{}", id.replace('_', "-")))
    }

    /// Refuse the first of `ids` given: it does not apply, as `why` says.
    fn refuse(&self, ids: &[&str], why: &str) -> Result<(), String> {
        match self.any(ids) {
            Some(flag) => Err(format!("{flag} {why}")),
            None => Ok(()),
        }
    }
}

/// The flags a scenario would ignore in the way it was asked to run.
fn ignored_flags(scenario: &Scenario, given: &Given) -> Result<(), String> {
    match scenario {
        Scenario::Migrate(m) if m.mode == "postcopy" => given.refuse(
            &["trackers", "memories", "wss", "rate", "batches", "transport"],
            "applies to --mode precopy: post-copy runs its own guest (--postcopy-memory, --postcopy-array) over its own link (--link-mbit, --link-delay-ms)",
        ),
        Scenario::Migrate(m) if m.peer.is_none() => given.refuse(
            &["link_mbit", "link_delay_ms", "postcopy_memory", "postcopy_array", "postcopy_seconds"],
            "applies to --mode postcopy only",
        ),
        Scenario::HaltPoll { devices, .. } => {
            if !devices.iter().any(|d| matches!(d, Device::Slow)) {
                given.refuse(&["io_dir"], "is the slow device's: --devices has no slow")?;
            }
            if !devices.iter().any(|d| matches!(d, Device::Fast)) {
                given.refuse(&["fast_dir"], "is the fast device's: --devices has no fast")?;
            }
            Ok(())
        }
        Scenario::DirtyLog { trackers, .. } if !trackers.iter().any(|t| t == "ring") => {
            given.refuse(&["ring_entries"], "applies to the ring tracker, which --trackers leaves out")
        }
        Scenario::Boost(b) => {
            if !b.tests.iter().any(|t| matches!(t, BoostTest::Audio)) {
                given.refuse(&["buffers", "work_us"], "applies to the audio test, which --tests leaves out")?;
            }
            if !b.tests.iter().any(|t| matches!(t, BoostTest::Timer)) {
                given.refuse(&["intervals"], "applies to the timer test, which --tests leaves out")?;
            }
            if !b.tests.iter().any(|t| matches!(t, BoostTest::Uart)) {
                given.refuse(&["uart_count"], "applies to the uart test, which --tests leaves out")?;
            }
            if !b.variants.iter().any(|v| v.starts_with("keep")) {
                given.refuse(&["keep_us"], "applies to the keep and keep-contended variants, which --variants leaves out")?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The directories the scenario writes to, checked before anything runs
/// (a scenario may run for minutes): `--out`, and halt-poll's devices'.
fn where_it_writes(scenario: &Scenario) -> Result<(), hover_bench::BenchError> {
    hover_bench::flags::out_dir(scenario.out())?;
    if let Scenario::HaltPoll {
        devices,
        fast_dir,
        io_dir,
        ..
    } = scenario
    {
        for d in devices {
            match d {
                Device::Fast => hover_bench::flags::writable_dir("--fast-dir", fast_dir)?,
                Device::Slow => hover_bench::flags::writable_dir("--io-dir", io_dir)?,
            }
        }
    }
    Ok(())
}

/// Run `hover bench <scenario>`.
pub fn bench(args: BenchArgs, given: Given) -> ExitCode {
    die_on_broken_pipe();
    if let Err(e) = ignored_flags(&args.scenario, &given) {
        eprintln!("hover: error: {e}");
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    if let Err(e) = where_it_writes(&args.scenario) {
        return bench_result(Err(e));
    }
    // Scenarios run `hover run` as fresh processes, as a user would.
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("hover: error: cannot find the hover binary to benchmark: {e}");
            return ExitCode::from(EXIT_HOST_FAILURE);
        }
    };
    bench_result(match args.scenario {
        Scenario::Boot {
            runs,
            vcpus,
            peer,
            out,
        } => hover_bench::boot::run(&exe, runs, vcpus, &out).and_then(|()| match peer {
            Some(Peer::Qemu) => hover_bench::boot::run_peer(&exe, runs, &out),
            None => Ok(()),
        }),
        Scenario::Plot { file, out } => hover_bench::replot::from_results(&file, &out),
        Scenario::Runtime { runs, peer, out } => {
            hover_bench::runtime::run(&exe, runs, peer.is_some(), &out)
        }
        Scenario::Migrate(args) => return migrate(&exe, args),
        Scenario::DirtyLog {
            trackers,
            memory,
            wss,
            rate,
            period_ms,
            seconds,
            ring_entries,
            runs,
            out,
        } => {
            let b = hover_bench::dirty_log::DirtyLogBench {
                trackers,
                memory,
                wss,
                rate,
                period_ms,
                seconds,
                ring_entries,
                runs,
            };
            b.check()
                .and_then(|()| hover_bench::dirty_log::run(&exe, &b, &out))
        }
        Scenario::Snapshot {
            memories,
            working_set,
            runs,
            hot_windows_ms,
            dir,
            out,
        } => {
            let b = hover_bench::snapshot::SnapshotBench {
                memories,
                working_set,
                runs,
                hot_windows_ms,
                dir,
            };
            b.check()
                .and_then(|()| hover_bench::snapshot::run(&exe, &b, &out))
        }
        Scenario::Boost(args) => return boost(&exe, args),
        Scenario::HaltPoll {
            seconds,
            runs,
            fast_dir,
            io_dir,
            devices,
            peer,
            out,
        } => {
            let chosen: Vec<_> = devices
                .iter()
                .map(|d| match d {
                    Device::Fast => ("fast".to_string(), fast_dir.clone()),
                    Device::Slow => ("slow".to_string(), io_dir.clone()),
                })
                .collect();
            hover_bench::halt_poll::run(
                &exe,
                &hover_bench::halt_poll::HaltPollBench {
                    seconds,
                    runs,
                    devices: chosen,
                    peer: peer.is_some(),
                },
                &out,
            )
        }
        Scenario::Apf {
            latencies,
            seconds,
            runs,
            adaptive_min_us,
            out,
        } => {
            let b = hover_bench::apf::ApfBench {
                latencies,
                seconds,
                runs,
                adaptive_min_us,
                ..Default::default()
            };
            hover_bench::apf::run(&exe, &b, &out)
        }
    })
}

/// `hover bench migrate`: its flags checked, then the scenario its mode
/// and peer choose.
fn migrate(exe: &std::path::Path, args: MigrateArgs) -> ExitCode {
    let MigrateArgs {
        trackers,
        memories,
        wss,
        rate,
        batches,
        runs,
        transport,
        mode,
        peer,
        link_mbit,
        link_delay_ms,
        postcopy_memory,
        postcopy_array,
        postcopy_seconds,
        out,
    } = args;
    bench_result({
        if peer.is_some() && mode == "postcopy" {
            eprintln!("hover: error: --peer qemu compares pre-copy only (--mode precopy): QEMU's post-copy has no counterpart of Hover's async-PF destination to compare");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
        if let Some(Peer::Qemu) = peer {
            let b = hover_bench::migrate_peer::PeerMigrateBench {
                memories,
                wss,
                rate,
                runs,
            };
            b.check()
                .and_then(|()| hover_bench::migrate_peer::run(exe, &b, &out))
        } else if mode == "postcopy" {
            let b = hover_bench::postcopy::PostcopyBench {
                memory: postcopy_memory,
                array: postcopy_array,
                link_mbit,
                delay_ms: link_delay_ms,
                runs,
                seconds: postcopy_seconds,
            };
            b.check()
                .and_then(|()| hover_bench::postcopy::run(exe, &b, &out))
        } else {
            let b = hover_bench::migrate::MigrateBench {
                trackers,
                memories,
                wss,
                rate,
                batches,
                runs,
                transport,
            };
            b.check()
                .and_then(|()| hover_bench::migrate::run(exe, &b, &out))
        }
    })
}

/// `hover bench boost`: its flags checked, then the scenario.
fn boost(exe: &std::path::Path, args: BoostArgs) -> ExitCode {
    if let Err(e) = args.check() {
        eprintln!("hover: error: {e}");
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    let BoostArgs {
        seconds,
        runs,
        intervals,
        buffers,
        work_us,
        background,
        hogs,
        uart_count,
        variants,
        keep_us,
        hosts,
        tests,
        out,
    } = args;
    bench_result({
        hover_bench::boost::run(
            exe,
            &hover_bench::boost::BoostBench {
                seconds,
                runs,
                intervals,
                buffers,
                work_us,
                background,
                hogs,
                uart_count,
                variants,
                keep_us,
                hosts: hosts
                    .iter()
                    .map(|h| match h {
                        BoostHost::Idle => hover_bench::boost::Host::Idle,
                        BoostHost::Busy => hover_bench::boost::Host::Busy,
                    })
                    .collect(),
                tests: tests
                    .iter()
                    .map(|t| match t {
                        BoostTest::Timer => hover_bench::boost::TestKind::Timer,
                        BoostTest::Audio => hover_bench::boost::TestKind::Audio,
                        BoostTest::Uart => hover_bench::boost::TestKind::Uart,
                        BoostTest::Rogue => hover_bench::boost::TestKind::Rogue,
                    })
                    .collect(),
            },
            &out,
        )
    })
}

fn bench_result(result: Result<(), hover_bench::BenchError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(hover_bench::BenchError::Vm(e)) => fail(&e),
        Err(e @ hover_bench::BenchError::Input(_)) => {
            eprintln!("hover: error: {e}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
        Err(e) => {
            eprintln!("hover: error: {e}");
            ExitCode::from(EXIT_HOST_FAILURE)
        }
    }
}
