//! Hover's benchmark scenarios. Each one states what it measures, takes its
//! knobs from the command line, prints a table and writes JSON, in the manner
//! of KVM's selftests (`dirty_log_perf_test`, `demand_paging_test`).
#![deny(missing_docs)]

pub mod apf;
pub mod boost;
pub mod boot;
pub mod dirty_log;
pub mod flags;
pub mod halt_poll;
pub mod halt_poll_peer;
pub mod hostload;
pub mod hover_process;
pub mod lab;
pub mod migrate;
pub mod migrate_peer;
mod migration_run;
pub mod netem;
pub mod peer;
pub mod plot;
pub mod postcopy;
pub mod qmp;
pub mod replot;
pub mod runtime;
pub mod snapshot;
pub mod stats;
pub mod table;

/// Why a scenario could not finish.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A VM failed to build or run.
    #[error(transparent)]
    Vm(#[from] hover_vmm::Error),
    /// The guest ran but did not do what the scenario needs.
    #[error("{0}")]
    Guest(String),
    /// What the user gave cannot be used (a results file to plot that is
    /// not one).
    #[error("{0}")]
    Input(String),
    /// Writing results failed.
    #[error("cannot write results to {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}
