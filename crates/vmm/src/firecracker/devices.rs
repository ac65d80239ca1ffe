//! A Linux guest's devices as Firecracker's API configures them before
//! the start (`PUT /drives/{drive_id}`, `PUT /network-interfaces/{iface_id}`,
//! `PUT /entropy`, or the same lists in `--config-file`), checked as each
//! arrives and turned into Hover's disks, cards and entropy device at the
//! start. The root drive is the first disk (`/dev/vda`) whatever the order
//! given, and the kernel's command line names it, as Firecracker does.

use std::path::{Path, PathBuf};

use super::models::{Balloon, Drive, EntropyDevice, NetworkInterface};
use super::refusal::Refusal;
use crate::config::{DiskConfig, HostConfig, MachineConfig, NetConfig, MAX_VIRTIO_DEVICES};
use crate::devices::virtio::block::open_disk;
use crate::devices::virtio::net::{default_mac, parse_mac};

/// The devices configured so far.
#[derive(Clone, Debug, Default)]
pub(super) struct LinuxDevices {
    /// Drives in the order given (the root drive is moved first at the start).
    pub(super) drives: Vec<Drive>,
    /// Network interfaces in the order given.
    pub(super) nets: Vec<NetworkInterface>,
    /// The entropy device, if one was asked for.
    pub(super) entropy: Option<EntropyDevice>,
    /// The balloon, if one was asked for.
    pub(super) balloon: Option<Balloon>,
}

fn refuse_limiter(what: &str, given: &Option<serde_json::Value>) -> Result<(), Refusal> {
    match given {
        Some(v) if !v.is_null() => Err(Refusal(format!(
            "{what}: Hover has no rate limiters; omit it (limit the guest's I/O on the host, e.g. with cgroups)"
        ))),
        _ => Ok(()),
    }
}

fn same_id(kind: &str, in_path: &str, in_body: &str) -> Result<(), Refusal> {
    if in_path != in_body {
        return Err(Refusal(format!(
            "The id from the path [{in_path}] does not match the id from the body [{in_body}]! ({kind})"
        )));
    }
    Ok(())
}

impl LinuxDevices {
    /// Whether any device was configured.
    pub(super) fn is_empty(&self) -> bool {
        self.drives.is_empty()
            && self.nets.is_empty()
            && self.entropy.is_none()
            && self.balloon.is_none()
    }

    fn count_with(&self, extra: usize) -> Result<(), Refusal> {
        let n = self.drives.len()
            + self.nets.len()
            + usize::from(self.entropy.is_some())
            + usize::from(self.balloon.is_some())
            + extra;
        if n > MAX_VIRTIO_DEVICES {
            return Err(Refusal(format!(
                "{n} devices: Hover gives a guest at most {MAX_VIRTIO_DEVICES} (one interrupt line each)"
            )));
        }
        Ok(())
    }

    /// `PUT /drives/{id}`: add a drive, or replace the one of that id.
    pub(super) fn put_drive(&mut self, id: &str, d: Drive) -> Result<(), Refusal> {
        same_id("drive_id", id, &d.drive_id)?;
        if !crate::config::devices::valid_device_id(id) {
            return Err(Refusal(format!(
                "drive_id {}: give 1 to 20 printable characters (the guest reads it as the disk's serial)",
                crate::api::quote(id)
            )));
        }
        refuse_limiter("rate_limiter", &d.rate_limiter)?;
        if d.socket.is_some() {
            return Err(Refusal::from(
                "socket: Hover has no vhost-user drives; give path_on_host",
            ));
        }
        match d.cache_type.as_deref() {
            None | Some("Unsafe") | Some("Writeback") => {}
            Some(other) => {
                return Err(Refusal(format!(
                    "cache_type {}: give Unsafe or Writeback",
                    crate::api::quote(other)
                )))
            }
        }
        match d.io_engine.as_deref() {
            None | Some("Sync") | Some("Async") => {}
            Some(other) => {
                return Err(Refusal(format!(
                    "io_engine {}: give Sync or Async",
                    crate::api::quote(other)
                )))
            }
        }
        if d.partuuid.is_some() && !d.is_root_device {
            return Err(Refusal(
                "partuuid names the root partition: give it with is_root_device true".into(),
            ));
        }
        if d.is_root_device
            && self
                .drives
                .iter()
                .any(|o| o.is_root_device && o.drive_id != d.drive_id)
        {
            return Err(Refusal::from("A root block device already exists!"));
        }
        // Opened now to refuse a bad path at once; opened again at the start.
        open_disk(Path::new(&d.path_on_host), d.is_read_only)
            .map_err(|why| format!("path_on_host {}: {why}", d.path_on_host))?;
        match self.drives.iter_mut().find(|o| o.drive_id == d.drive_id) {
            Some(slot) => *slot = d,
            None => {
                self.count_with(1)?;
                self.drives.push(d);
            }
        }
        Ok(())
    }

    /// `PUT /network-interfaces/{id}`: add a card, or replace that id's.
    pub(super) fn put_net(&mut self, id: &str, n: NetworkInterface) -> Result<(), Refusal> {
        same_id("iface_id", id, &n.iface_id)?;
        refuse_limiter("rx_rate_limiter", &n.rx_rate_limiter)?;
        refuse_limiter("tx_rate_limiter", &n.tx_rate_limiter)?;
        if let Some(mac) = &n.guest_mac {
            let mac = parse_mac(mac).map_err(|e| format!("guest_{e}"))?;
            let taken = self.nets.iter().any(|o| {
                o.iface_id != n.iface_id
                    && o.guest_mac.as_deref().and_then(|m| parse_mac(m).ok()) == Some(mac)
            });
            if taken {
                return Err(Refusal(format!(
                    "guest_mac {}: another interface has it",
                    n.guest_mac.as_deref().unwrap_or_default()
                )));
            }
        }
        let name = &n.host_dev_name;
        if self
            .nets
            .iter()
            .any(|o| o.iface_id != n.iface_id && &o.host_dev_name == name)
        {
            return Err(Refusal(format!(
                "host_dev_name {name}: another interface uses this tap"
            )));
        }
        crate::devices::virtio::net::check_tap_exists(name)
            .map_err(|e| format!("host_dev_name: {e}"))?;
        match self.nets.iter_mut().find(|o| o.iface_id == n.iface_id) {
            Some(slot) => *slot = n,
            None => {
                self.count_with(1)?;
                self.nets.push(n);
            }
        }
        Ok(())
    }

    /// `PUT /entropy`.
    pub(super) fn put_entropy(&mut self, e: EntropyDevice) -> Result<(), Refusal> {
        refuse_limiter("rate_limiter", &e.rate_limiter)?;
        if self.entropy.is_none() {
            self.count_with(1)?;
        }
        self.entropy = Some(e);
        Ok(())
    }

    /// `PUT /balloon` (before the start; again: replaced). Free page
    /// hinting is refused (Hover's balloon reports free pages instead).
    pub(super) fn put_balloon(&mut self, b: Balloon) -> Result<(), Refusal> {
        if b.free_page_hinting == Some(true) {
            return Err(Refusal::from("free_page_hinting: Hover's balloon does not hint; give free_page_reporting: true (the guest reports its free pages, which Hover drops)"));
        }
        if self.balloon.is_none() {
            self.count_with(1)?;
        }
        self.balloon = Some(b);
        Ok(())
    }

    /// `PATCH /balloon` before the start: a new target.
    pub(super) fn patch_balloon(&mut self, amount_mib: u64) -> Result<(), Refusal> {
        match &mut self.balloon {
            Some(b) => {
                b.amount_mib = amount_mib;
                Ok(())
            }
            None => Err(Refusal::from("there is no balloon: PUT /balloon first")),
        }
    }

    /// Give `machine` and `host` these devices, and the command line the
    /// root drive: `root=/dev/vda` (or `root=PARTUUID=...`) and `rw`/`ro`.
    pub(super) fn apply(&self, machine: &mut MachineConfig, host: &mut HostConfig) {
        let mut drives: Vec<&Drive> = self.drives.iter().filter(|d| d.is_root_device).collect();
        drives.extend(self.drives.iter().filter(|d| !d.is_root_device));
        machine.disks = drives
            .iter()
            .map(|d| DiskConfig {
                id: d.drive_id.clone(),
                readonly: d.is_read_only,
                size: 0,
            })
            .collect();
        host.disk_paths = drives
            .iter()
            .map(|d| PathBuf::from(&d.path_on_host))
            .collect();
        if let Some(root) = drives.first().filter(|d| d.is_root_device) {
            let dev = match &root.partuuid {
                Some(p) => format!("root=PARTUUID={p}"),
                None => "root=/dev/vda".into(),
            };
            let mode = if root.is_read_only { "ro" } else { "rw" };
            machine.cmdline = format!("{} {dev} {mode}", machine.cmdline)
                .trim_start()
                .to_string();
        }
        machine.nets = self
            .nets
            .iter()
            .enumerate()
            .map(|(i, n)| NetConfig {
                id: n.iface_id.clone(),
                mac: n
                    .guest_mac
                    .as_deref()
                    .and_then(|m| parse_mac(m).ok())
                    .unwrap_or_else(|| default_mac(i)),
            })
            .collect();
        host.taps = self.nets.iter().map(|n| n.host_dev_name.clone()).collect();
        machine.rng = self.entropy.is_some();
        machine.balloon = self.balloon.as_ref().map(|b| crate::config::BalloonConfig {
            target_mib: b.amount_mib,
            free_page_reporting: b.free_page_reporting,
            deflate_on_oom: b.deflate_on_oom,
            stats_interval_s: b.stats_polling_interval_s,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drive(id: &str, path: &Path, root: bool) -> Drive {
        Drive {
            drive_id: id.into(),
            path_on_host: path.display().to_string(),
            is_root_device: root,
            is_read_only: false,
            partuuid: None,
            cache_type: None,
            io_engine: None,
            rate_limiter: None,
            socket: None,
        }
    }

    fn disk_file(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("hover-fc-dev-{}-{name}", std::process::id()));
        std::fs::write(&p, [0u8; 4096]).unwrap();
        p
    }

    #[test]
    fn the_root_drive_comes_first_and_is_named_on_the_command_line() {
        let (a, b) = (disk_file("a"), disk_file("b"));
        let mut d = LinuxDevices::default();
        d.put_drive("data", drive("data", &a, false)).unwrap();
        d.put_drive("rootfs", drive("rootfs", &b, true)).unwrap();
        let mut m = MachineConfig {
            cmdline: "console=ttyS0".into(),
            ..MachineConfig::default()
        };
        let mut h = HostConfig::default();
        d.apply(&mut m, &mut h);
        assert_eq!(m.disks[0].id, "rootfs");
        assert_eq!(h.disk_paths, vec![b.clone(), a.clone()]);
        assert_eq!(m.cmdline, "console=ttyS0 root=/dev/vda rw");
        assert!(!m.rng, "no entropy device unless PUT /entropy");
        std::fs::remove_file(a).unwrap();
        std::fs::remove_file(b).unwrap();
    }

    #[test]
    fn a_read_only_root_with_a_partuuid_is_named_so() {
        let a = disk_file("ro");
        let mut d = LinuxDevices::default();
        let mut r = drive("root", &a, true);
        r.is_read_only = true;
        r.partuuid = Some("0eaa91a0-01".into());
        d.put_drive("root", r).unwrap();
        let mut m = MachineConfig {
            cmdline: String::new(),
            ..MachineConfig::default()
        };
        d.apply(&mut m, &mut HostConfig::default());
        assert_eq!(m.cmdline, "root=PARTUUID=0eaa91a0-01 ro");
        assert!(m.disks[0].readonly);
        std::fs::remove_file(a).unwrap();
    }

    #[test]
    fn bad_drives_are_refused_naming_the_problem() {
        let a = disk_file("bad");
        let mut d = LinuxDevices::default();
        let err = |d: &mut LinuxDevices, id: &str, x: Drive| d.put_drive(id, x).unwrap_err().0;
        assert!(err(&mut d, "x", drive("y", &a, false)).contains("does not match"));
        assert!(err(
            &mut d,
            "x",
            drive("x", Path::new("/nonexistent.img"), false)
        )
        .contains("path_on_host"));
        let mut limited = drive("x", &a, false);
        limited.rate_limiter = Some(serde_json::json!({"bandwidth": {}}));
        assert!(err(&mut d, "x", limited).contains("rate limiters"));
        let mut cache = drive("x", &a, false);
        cache.cache_type = Some("Fast".into());
        assert!(err(&mut d, "x", cache).contains("Unsafe or Writeback"));
        let long = "x".repeat(21);
        assert!(err(&mut d, &long, drive(&long, &a, false)).contains("1 to 20"));
        d.put_drive("r1", drive("r1", &a, true)).unwrap();
        assert_eq!(
            err(&mut d, "r2", drive("r2", &a, true)),
            "A root block device already exists!"
        );
        // The same id again replaces it (still one root).
        d.put_drive("r1", drive("r1", &a, true)).unwrap();
        assert_eq!(d.drives.len(), 1);
        std::fs::remove_file(a).unwrap();
    }

    #[test]
    fn bad_interfaces_are_refused_naming_the_problem() {
        let net = |id: &str, tap: &str, mac: Option<&str>| NetworkInterface {
            iface_id: id.into(),
            host_dev_name: tap.into(),
            guest_mac: mac.map(String::from),
            rx_rate_limiter: None,
            tx_rate_limiter: None,
        };
        let mut d = LinuxDevices::default();
        assert!(d
            .put_net("eth0", net("eth1", "tap0", None))
            .unwrap_err()
            .0
            .contains("does not match"));
        assert!(d
            .put_net("eth0", net("eth0", "hvnosuchtap7", None))
            .unwrap_err()
            .0
            .contains("no such network device"));
        assert!(d
            .put_net("eth0", net("eth0", "lo", Some("01:00:00:00:00:01")))
            .unwrap_err()
            .0
            .contains("multicast"));
    }

    #[test]
    fn devices_beyond_the_interrupt_lines_are_refused() {
        let a = disk_file("many");
        let mut d = LinuxDevices::default();
        for i in 0..MAX_VIRTIO_DEVICES {
            let id = format!("d{i}");
            d.put_drive(&id, drive(&id, &a, false)).unwrap();
        }
        assert!(d
            .put_entropy(EntropyDevice::default())
            .unwrap_err()
            .0
            .contains("at most"));
        std::fs::remove_file(a).unwrap();
    }
}
