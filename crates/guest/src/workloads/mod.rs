//! Workloads, selected by `workload=NAME` on the command line. The table of
//! names and parameters lives in `hover_abi::workload`, shared with the monitor.

mod exception;
mod hello;
mod triple_fault;

use hover_abi::boot::BootInfo;
use hover_abi::exit_code;
use hover_abi::workload::{self, WorkloadError};

use crate::{control, nub, println};

/// What every workload gets on every vCPU.
pub struct Context {
    /// This vCPU's index.
    pub cpu: usize,
    /// The boot-info page.
    pub boot: &'static BootInfo,
    /// The command line.
    pub cmdline: &'static str,
    /// TSC at this vCPU's first instruction.
    pub boot_tsc: u64,
}

/// Run the selected workload on this vCPU.
pub fn run(ctx: Context) -> ! {
    let spec = match workload::resolve(ctx.cmdline) {
        Ok(spec) => spec,
        Err(e) => {
            if ctx.cpu == 0 {
                let code = match e {
                    WorkloadError::Syntax(err) => {
                        println!("guest: bad command line: {:?}", err);
                        exit_code::BAD_CMDLINE
                    }
                    WorkloadError::UnknownWorkload(name) => {
                        println!("guest: unknown workload '{}'", name);
                        exit_code::UNKNOWN_WORKLOAD
                    }
                    WorkloadError::UnknownParam { workload, key } => {
                        println!("guest: workload {} takes no parameter '{}'", workload, key);
                        exit_code::BAD_CMDLINE
                    }
                };
                control::exit(code);
            }
            idle()
        }
    };
    match spec.name {
        "hello" => hello::run(ctx),
        "exception" => exception::run(ctx),
        "triple-fault" => triple_fault::run(ctx),
        other => {
            if ctx.cpu == 0 {
                println!(
                    "guest: workload '{}' is in the ABI table but not in this guest",
                    other
                );
                control::exit(exit_code::UNKNOWN_WORKLOAD);
            }
            idle()
        }
    }
}

/// Halt this vCPU for good (interrupts still run).
pub fn idle() -> ! {
    loop {
        nub::halt();
    }
}
