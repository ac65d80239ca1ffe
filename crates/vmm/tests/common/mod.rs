//! Booting the built-in guest for tests, with the console captured.

use hover_vmm::config::{HostConfig, MachineConfig};
use std::sync::{Arc, Mutex};

use hover_vmm::config::SharedBuffer;
use hover_vmm::{ConsoleTarget, Error, ReportValue, RunOutcome, Vm, VmConfig};

/// Run `config` with the console in a buffer; the result and the console text.
pub fn boot(config: VmConfig) -> (Result<RunOutcome, Error>, String) {
    let buf: SharedBuffer = Arc::new(Mutex::new(Vec::new()));
    let config = VmConfig {
        host: HostConfig {
            console: ConsoleTarget::Buffer(buf.clone()),
            ..config.host
        },
        ..config
    };
    let result = Vm::new(&config).and_then(Vm::run);
    let console = String::from_utf8_lossy(&buf.lock().unwrap()).into_owned();
    (result, console)
}

/// Run the built-in guest with `cmdline` on `vcpus` vCPUs; it must exit 0.
#[allow(dead_code)] // not every test file uses every helper
pub fn run_ok(vcpus: u32, cmdline: &str) -> (RunOutcome, String) {
    let (result, console) = boot(VmConfig {
        machine: MachineConfig {
            vcpus,
            cmdline: cmdline.into(),
            ..Default::default()
        },
        ..VmConfig::default()
    });
    let o = result.unwrap_or_else(|e| panic!("{cmdline}: {e}\nconsole:\n{console}"));
    assert_eq!(
        o.exit_code, 0,
        "{cmdline}: exit code {}\nconsole:\n{console}",
        o.exit_code
    );
    (o, console)
}

/// The unsigned report `key`; panics if missing.
#[allow(dead_code)]
pub fn report(o: &RunOutcome, key: &str) -> u64 {
    match o.reports.iter().find(|r| r.key == key).map(|r| r.value) {
        Some(ReportValue::U64(v)) => v,
        other => panic!("report {key}: {other:?} in {:?}", o.reports),
    }
}

/// A VM of `memory` bytes running `cmdline` with its console off, built
/// and not yet running; its API on `api_socket` if given.
#[allow(dead_code)]
pub fn quiet_vm(memory: u64, cmdline: &str, api_socket: Option<std::path::PathBuf>) -> Vm {
    let mut vm = Vm::new(&VmConfig {
        machine: MachineConfig {
            memory,
            cmdline: cmdline.into(),
            ..Default::default()
        },
        host: HostConfig {
            console: ConsoleTarget::Off,
            ..Default::default()
        },
    })
    .unwrap_or_else(|e| panic!("{cmdline}: {e}"));
    if let Some(path) = api_socket {
        vm.serve_api(Box::new(hover_vmm::api::SocketApi::new(&path)));
    }
    vm
}
