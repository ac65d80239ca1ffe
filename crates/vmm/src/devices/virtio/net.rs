//! virtio-net on a tap device: frames the guest sends go to the tap as
//! they are (the tap takes virtio's own 12-byte header, `IFF_VNET_HDR`),
//! frames the tap has go into the guest's receive buffers. Checksum and
//! TCP segmentation offloads pass through where the tap takes them: the
//! guest may send frames of up to 64 KiB with their checksum left to do
//! (the header says so; the host's stack finishes the work), and once the
//! guest accepts the same on receive, the tap is told (`TUNSETOFFLOAD`) to
//! hand it such frames too. The tap is opened by name
//! (`TUNSETIFF`); it must exist (Hover does not create network devices:
//! who may use one, its addresses and bridge are the host's to set), and
//! one another process holds is refused as busy. A restored or arrived
//! card announces its MAC on its tap (a RARP broadcast, as QEMU sends
//! after a migration), so the switches and bridges between the hosts
//! learn where the guest now is before it says anything itself.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};

use crate::memory::host_writes::TrackedMemory;
use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_MAC,
};
use virtio_queue::{Queue, QueueT, Reader, Writer};

use super::{read_config_bytes, VirtioDevice, F_VERSION_1};
use crate::seccomp::filters::TUNSETOFFLOAD;

/// Each queue's size.
const QUEUE_SIZE: u16 = 256;
/// virtio-net's header with VERSION_1 (`struct virtio_net_hdr_v1`).
const HDR: usize = 12;
/// The largest frame taken or given: an Ethernet frame of a 64 KiB packet.
const MAX_FRAME: usize = HDR + 65550;
const RX: usize = 0;
const TX: usize = 1;

pub use crate::config::NetConfig;

/// Parse `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split(':').collect();
    let bad = || format!("mac={s}: give six hex bytes, e.g. 06:00:00:00:00:01");
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut mac = [0u8; 6];
    for (m, p) in mac.iter_mut().zip(parts) {
        *m = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    if mac[0] & 1 != 0 {
        return Err(format!("mac={s}: a multicast address cannot be a card's"));
    }
    Ok(mac)
}

/// The announcement of `mac` (QEMU's `announce_self_create`): a RARP
/// "reverse request" from the MAC to everyone, padded to Ethernet's 60
/// bytes, behind a virtio-net header that asks nothing of the tap.
pub fn announcement(mac: [u8; 6]) -> [u8; HDR + 60] {
    let mut f = [0u8; HDR + 60];
    let e = &mut f[HDR..];
    e[0..6].fill(0xff);
    e[6..12].copy_from_slice(&mac);
    e[12..14].copy_from_slice(&0x8035u16.to_be_bytes()); // ETH_P_RARP
    e[14..16].copy_from_slice(&1u16.to_be_bytes()); // Ethernet hardware
    e[16..18].copy_from_slice(&0x0800u16.to_be_bytes()); // IPv4
    e[18] = 6;
    e[19] = 4;
    e[20..22].copy_from_slice(&3u16.to_be_bytes()); // reverse request
    e[22..28].copy_from_slice(&mac); // sender hardware address
    e[32..38].copy_from_slice(&mac); // target hardware address
    f
}

/// The default MAC of card `index`: locally administered, unicast.
pub fn default_mac(index: usize) -> [u8; 6] {
    [0x06, 0, 0, 0, 0, index as u8 + 1]
}

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
const TUN_F_CSUM: libc::c_uint = 0x01;
const TUN_F_TSO4: libc::c_uint = 0x02;
const TUN_F_TSO6: libc::c_uint = 0x04;

/// The offloads offered when the tap takes them: sending frames with the
/// checksum left to do and TCP segments of up to 64 KiB (the tap takes
/// both from any writer with `IFF_VNET_HDR`), and receiving the same (the
/// tap hands them out once `TUNSETOFFLOAD` allows).
const OFFLOADS: u64 = (1 << VIRTIO_NET_F_CSUM)
    | (1 << VIRTIO_NET_F_HOST_TSO4)
    | (1 << VIRTIO_NET_F_HOST_TSO6)
    | (1 << VIRTIO_NET_F_GUEST_CSUM)
    | (1 << VIRTIO_NET_F_GUEST_TSO4)
    | (1 << VIRTIO_NET_F_GUEST_TSO6);

/// What the tap may hand the guest, given the features it accepted.
fn tap_offloads(features: u64) -> libc::c_uint {
    let has = |bit: u32| features & (1 << bit) != 0;
    let mut f = 0;
    if has(VIRTIO_NET_F_GUEST_CSUM) {
        f |= TUN_F_CSUM;
        // Segments need checksum offload too (the spec's dependency).
        if has(VIRTIO_NET_F_GUEST_TSO4) {
            f |= TUN_F_TSO4;
        }
        if has(VIRTIO_NET_F_GUEST_TSO6) {
            f |= TUN_F_TSO6;
        }
    }
    f
}

/// Set what `tap` may hand out.
fn set_tap_offloads(tap: &File, flags: libc::c_uint) -> std::io::Result<()> {
    // SAFETY: TUNSETOFFLOAD takes its flags by value; the result is checked.
    if unsafe { libc::ioctl(tap.as_raw_fd(), TUNSETOFFLOAD as _, flags as libc::c_ulong) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;

/// `struct ifreq` as TUNSETIFF reads it: a name and flags.
#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Why a tap cannot carry a guest's network card.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// Not a name a network device can have.
    #[error("tap={0}: a device name of 1 to 15 characters")]
    BadName(String),
    /// No network device of that name (Hover opens taps, never makes them).
    #[error("tap={0}: no such network device (create the tap first, e.g. `ip tuntap add {0} mode tap user $USER`)")]
    Missing(String),
    /// The tun driver cannot be opened.
    #[error("cannot open /dev/net/tun: {0} (is the tun module loaded?)")]
    NoTun(std::io::Error),
    /// Another process holds the tap.
    #[error("tap={0}: busy (another process has it open)")]
    Busy(String),
    /// This user may not attach to it.
    #[error("tap={name}: not allowed ({source}; CAP_NET_ADMIN, or a tap made for this user)")]
    NotAllowed {
        /// The tap.
        name: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The device is not a tap.
    #[error("tap={name}: not a tap device ({source}): give a tap's name (`ip tuntap add {name} mode tap`)")]
    NotATap {
        /// The device.
        name: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Another failure of the tun driver.
    #[error("tap={name}: {source}")]
    Os {
        /// The tap.
        name: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Check that network device `name` exists (Hover opens taps, never
/// makes them).
pub fn check_tap_exists(name: &str) -> Result<(), TapError> {
    let bad = || TapError::BadName(name.to_string());
    if name.is_empty() || name.len() >= 16 || name.contains('/') {
        return Err(bad());
    }
    let cname = std::ffi::CString::new(name).map_err(|_| bad())?;
    // SAFETY: reads a NUL-terminated name.
    if unsafe { libc::if_nametoindex(cname.as_ptr()) } == 0 {
        return Err(TapError::Missing(name.to_string()));
    }
    Ok(())
}

/// Open the existing tap `name` for frames with virtio's 12-byte header,
/// non-blocking.
pub fn open_tap(name: &str) -> Result<File, TapError> {
    check_tap_exists(name)?;
    let path = std::ffi::CString::new("/dev/net/tun").expect("no NUL");
    // SAFETY: opening a device node; the descriptor is owned at once.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(TapError::NoTun(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    let mut req = IfReq {
        name: [0; 16],
        flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads an ifreq of this layout; the result is checked.
    if unsafe { libc::ioctl(fd, TUNSETIFF as _, &mut req) } < 0 {
        let e = std::io::Error::last_os_error();
        let name = name.to_string();
        return Err(match e.raw_os_error() {
            Some(libc::EBUSY) => TapError::Busy(name),
            Some(libc::EPERM) => TapError::NotAllowed { name, source: e },
            Some(libc::EINVAL) => TapError::NotATap { name, source: e },
            _ => TapError::Os { name, source: e },
        });
    }
    let size: libc::c_int = HDR as libc::c_int;
    // SAFETY: TUNSETVNETHDRSZ reads an int; the result is checked.
    if unsafe { libc::ioctl(fd, TUNSETVNETHDRSZ as _, &size) } < 0 {
        return Err(TapError::Os {
            name: name.to_string(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(file)
}

/// A virtio network card on a tap.
pub struct Net {
    config: NetConfig,
    name: String,
    tap: File,
    /// Whether the tap takes offloads (it took them all when opened).
    offloads: bool,
    buf: Vec<u8>,
    /// A frame read from the tap that found no receive buffer yet.
    pending: Option<usize>,
    complained: bool,
}

impl Net {
    /// The card `config` on the open tap `tap` (named `name`, for logs).
    pub fn new(config: NetConfig, name: String, tap: File) -> Net {
        // Tried at once, then off until the guest accepts them.
        let offloads = set_tap_offloads(&tap, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)
            .and_then(|()| set_tap_offloads(&tap, 0))
            .is_ok();
        if !offloads {
            tracing::info!("virtio net {name}: the tap takes no offloads; the guest checksums and segments itself");
        }
        Net {
            config,
            name,
            tap,
            offloads,
            buf: vec![0; MAX_FRAME],
            pending: None,
            complained: false,
        }
    }

    fn complain(&mut self, why: &str) {
        if !self.complained {
            tracing::warn!("virtio net {}: {why}", self.name);
            self.complained = true;
        }
    }

    /// Send every frame the guest queued.
    fn transmit(&mut self, queue: &mut Queue, mem: &TrackedMemory) -> bool {
        let mut used = false;
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            match Reader::new(mem, chain) {
                Ok(mut r) => {
                    let n = r.available_bytes();
                    if !(HDR..=MAX_FRAME).contains(&n) {
                        self.complain(&format!(
                            "a {n}-byte frame to send (12 to {MAX_FRAME} taken)"
                        ));
                    } else if r.read_exact(&mut self.buf[..n]).is_ok() {
                        // A full tap (nobody reads it) drops the frame, as a wire would.
                        let _ = self.tap.write(&self.buf[..n]);
                    }
                }
                Err(_) => self.complain("a frame whose buffers are outside guest memory or loop"),
            }
            if queue.add_used(mem, head, 0).is_err() {
                return used;
            }
            used = true;
        }
        used
    }

    /// Give the guest every frame the tap has, while it has buffers.
    fn receive(&mut self, queue: &mut Queue, mem: &TrackedMemory) -> bool {
        let mut used = false;
        loop {
            let n = match self.pending.take() {
                Some(n) => n,
                None => match self.tap.read(&mut self.buf) {
                    Ok(n) if n >= HDR => n,
                    Ok(_) => continue,
                    Err(_) => return used, // EAGAIN: drained (or the tap went away)
                },
            };
            // One buffer chain per frame (no mergeable buffers), so
            // num_buffers is 1.
            self.buf[10..12].copy_from_slice(&1u16.to_le_bytes());
            let Some(chain) = queue.pop_descriptor_chain(mem) else {
                self.pending = Some(n);
                return used;
            };
            let head = chain.head_index();
            let written = match Writer::new(mem, chain) {
                Ok(mut w) if w.available_bytes() >= n => match w.write_all(&self.buf[..n]) {
                    Ok(()) => n as u32,
                    Err(_) => 0,
                },
                Ok(_) => {
                    self.complain("a receive buffer smaller than a frame (frame dropped)");
                    0
                }
                Err(_) => {
                    self.complain("a receive buffer outside guest memory or looping");
                    0
                }
            };
            if queue.add_used(mem, head, written).is_err() {
                return used;
            }
            used = true;
        }
    }
}

impl VirtioDevice for Net {
    fn device_id(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn name(&self) -> String {
        format!("net {}", self.name)
    }

    fn features(&self) -> u64 {
        let offloads = if self.offloads { OFFLOADS } else { 0 };
        F_VERSION_1 | (1 << VIRTIO_NET_F_MAC) | offloads
    }

    fn ack_features(&mut self, features: u64) {
        if !self.offloads {
            return;
        }
        if let Err(e) = set_tap_offloads(&self.tap, tap_offloads(features)) {
            self.complain(&format!("the tap refused its offloads: {e}"));
        }
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE, QUEUE_SIZE]
    }

    fn announce(&mut self) {
        if let Err(e) = self.tap.write(&announcement(self.config.mac)) {
            self.complain(&format!("its MAC was not announced on the tap: {e}"));
        }
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // struct virtio_net_config starts with the MAC.
        read_config_bytes(&self.config.mac, offset, data)
    }

    fn process(&mut self, index: usize, queue: &mut Queue, mem: &TrackedMemory) -> bool {
        match index {
            TX => self.transmit(queue, mem),
            // New receive buffers: frames waiting for them go in now.
            RX => self.receive(queue, mem),
            _ => false,
        }
    }

    fn backend_fd(&self) -> Option<RawFd> {
        Some(self.tap.as_raw_fd())
    }

    fn backend_ready(&mut self, queues: &mut [Queue], mem: &TrackedMemory) -> bool {
        match queues.get_mut(RX) {
            Some(q) if q.ready() => self.receive(q, mem),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tap_hands_out_only_what_the_guest_accepted() {
        let csum = 1 << VIRTIO_NET_F_GUEST_CSUM;
        let tso4 = 1 << VIRTIO_NET_F_GUEST_TSO4;
        assert_eq!(tap_offloads(0), 0);
        assert_eq!(tap_offloads(OFFLOADS), TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6);
        assert_eq!(tap_offloads(csum), TUN_F_CSUM);
        assert_eq!(tap_offloads(csum | tso4), TUN_F_CSUM | TUN_F_TSO4);
        // Segments without checksum offload are not handed out.
        assert_eq!(tap_offloads(tso4), 0);
        // What the guest may send needs nothing of the tap's.
        assert_eq!(tap_offloads(1 << VIRTIO_NET_F_HOST_TSO4), 0);
    }

    #[test]
    fn macs_parse_and_bad_ones_are_refused() {
        assert_eq!(
            parse_mac("06:00:ac:10:00:02").unwrap(),
            [6, 0, 0xac, 0x10, 0, 2]
        );
        for bad in [
            "06:00:ac:10:00",
            "zz:00:00:00:00:01",
            "01:00:00:00:00:01",
            "",
        ] {
            assert!(parse_mac(bad).is_err(), "{bad}");
        }
        assert_eq!(default_mac(0), [6, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn the_announcement_is_a_rarp_broadcast_from_the_mac() {
        let mac = [6, 0, 0xac, 0x10, 0, 2];
        let f = announcement(mac);
        assert_eq!(
            f.len(),
            HDR + 60,
            "a minimal Ethernet frame behind the header"
        );
        assert!(
            f[..HDR].iter().all(|&b| b == 0),
            "no offload asked of the tap"
        );
        let e = &f[HDR..];
        assert_eq!(&e[0..6], &[0xff; 6], "to everyone");
        assert_eq!(&e[6..12], &mac, "from the guest's MAC");
        assert_eq!(&e[12..14], &[0x80, 0x35], "RARP");
        assert_eq!(
            &e[14..22],
            &[0, 1, 8, 0, 6, 4, 0, 3],
            "Ethernet/IPv4, reverse request"
        );
        assert_eq!(&e[22..28], &mac);
        assert_eq!(&e[28..32], &[0; 4]);
        assert_eq!(&e[32..38], &mac);
        assert!(e[38..].iter().all(|&b| b == 0));
    }

    #[test]
    fn tap_names_are_checked_before_the_device_is_opened() {
        assert!(open_tap("").unwrap_err().to_string().contains("1 to 15"));
        assert!(open_tap("a-name-far-too-long")
            .unwrap_err()
            .to_string()
            .contains("1 to 15"));
        assert!(open_tap("../x")
            .unwrap_err()
            .to_string()
            .contains("1 to 15"));
    }
}
