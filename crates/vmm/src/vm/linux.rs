//! Building a VM that boots a Linux kernel: the same machine as the
//! built-in guest's, with the PIT Linux calibrates against, the ACPI
//! tables it finds CPUs and devices in, and the boot protocol's zero page
//! and 64-bit entry on the boot vCPU (the others wait for its INIT/SIPI).

use std::time::Instant;

use hover_abi::layout::PAGE_SIZE;

use super::machine::Machine;
use super::{open_console, Vm};
use crate::arch::x86_64::{acpi, pvh, tables};
use crate::boot::linux::{self, LinuxBoot};
use crate::config::VmConfig;
use crate::state::SavedMachine;
use crate::vcpu::Entry;
use crate::{Error, KvmOp};

impl Vm {
    /// Build a VM from `config` that boots `boot`. Nothing runs yet.
    pub(super) fn new_linux(
        config: &VmConfig,
        boot: &LinuxBoot,
        created_at: Instant,
    ) -> Result<Vm, Error> {
        // Everything a boot can refuse, before anything is built.
        let cmdline =
            linux::effective_cmdline(&config.machine.cmdline, config.machine.guest_poll_max_ns);
        let image = linux::LinuxImage::read(boot, config.machine.memory, &cmdline)
            .map_err(|e| Error::Linux(Box::new(e)))?;
        for (disk, path) in config.machine.disks.iter().zip(&config.host.disk_paths) {
            crate::devices::virtio::block::open_disk(path, disk.readonly).map_err(|why| {
                crate::config::ConfigError::Devices(format!("--disk {}: {why}", path.display()))
            })?;
        }
        let m = Machine::create(config)?;
        let mem = m.ram.memory();
        tables::write_page_tables(mem, m.ram.end())?;
        tables::write_descriptor_tables(mem, config.machine.vcpus)?;
        let virtio = crate::devices::virtio::device_count(&config.machine);
        let rsdp = acpi::write_linux_tables(mem, config.machine.vcpus, virtio)?;
        let entry = image
            .load(mem, &cmdline, rsdp)
            .map_err(|e| Error::Linux(Box::new(e)))?;
        let tsc_khz = m.vcpus[0]
            .fd()
            .get_tsc_khz()
            .map_err(KvmOp::GetTscKhz.err())?;
        for v in &m.vcpus {
            let cpuid = pvh::with_tsc_leaf(&m.vcpu_cpuid(config, v.index()), tsc_khz);
            match v.index() {
                0 => v.configure_with(
                    &cpuid,
                    Entry::Linux {
                        entry: entry.rip,
                        zero_page: entry.zero_page,
                    },
                )?,
                _ => v.prepare_application_processor(&cpuid)?,
            }
        }
        let saved = SavedMachine {
            config: config.machine.clone(),
            // What a lazy restore loads first: the boot area and the kernel.
            image_end: entry.kernel_end.next_multiple_of(PAGE_SIZE),
        };
        let sink = open_console(config)?;
        Vm::assemble(m, config, saved, sink, None, created_at)
    }
}
