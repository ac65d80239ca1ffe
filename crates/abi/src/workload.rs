//! The built-in guest's workloads and the parameters each accepts.
//!
//! The monitor checks a command line against this table before it starts the
//! VM, so that a typo is a one-line error rather than a failed guest run.

use crate::cmdline::{self, CmdlineError};

/// Workload run when the command line names none.
pub const DEFAULT_WORKLOAD: &str = "hello";

/// One command-line parameter.
#[derive(Clone, Copy, Debug)]
pub struct ParamSpec {
    /// The key.
    pub name: &'static str,
    /// What it means, with its default.
    pub help: &'static str,
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

/// Parameters every workload accepts.
pub const GLOBAL_PARAMS: &[ParamSpec] = &[ParamSpec {
    name: "workload",
    help: "which workload to run (default hello)",
}];

/// Every workload of the built-in guest.
pub const WORKLOADS: &[WorkloadSpec] = &[
    WorkloadSpec {
        name: "hello",
        help: "every vCPU prints a greeting; reports vcpus_seen and boot_tsc",
        params: &[],
    },
    WorkloadSpec {
        name: "exception",
        help: "test: vCPU 0 executes ud2; the guest must print the exception and exit with code 19",
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
}

/// Check `cmdline` and return the workload it selects.
pub fn resolve(cmdline: &str) -> Result<&'static WorkloadSpec, WorkloadError<'_>> {
    cmdline::check_syntax(cmdline).map_err(WorkloadError::Syntax)?;
    let name = cmdline::get(cmdline, "workload").unwrap_or(DEFAULT_WORKLOAD);
    let spec = find(name).ok_or(WorkloadError::UnknownWorkload(name))?;
    for (key, _) in cmdline::pairs(cmdline).filter_map(Result::ok) {
        let known = GLOBAL_PARAMS
            .iter()
            .chain(spec.params)
            .any(|p| p.name == key);
        if !known {
            return Err(WorkloadError::UnknownParam {
                workload: spec.name,
                key,
            });
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
        assert_eq!(resolve("workload=hello").unwrap().name, "hello");
    }

    #[test]
    fn unknown_names_and_keys() {
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
    }
}
