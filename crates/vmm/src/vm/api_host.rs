//! How a running VM is served by an API without knowing the server: the
//! VM describes itself ([`LiveSources`], its [`Controller`]) and hands
//! both to an [`ApiHost`], which `api` implements (a socket of its own,
//! `api::SocketApi`; a slot in a server that outlives the VM,
//! `api::SlotApi`). So `vm` needs nothing from `api`.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::Controller;
use crate::devices::pvio::PvioDevice;
use crate::memory::paged::PagerStats;
use crate::sched::guest_poll::GuestPoll;
use crate::stats::KvmStats;
use crate::Error;

pub use crate::sched::halt_poll::GovernorSource;

/// Where live figures come from.
pub struct LiveSources {
    /// One stats fd per vCPU.
    pub vcpu_stats: Vec<KvmStats>,
    /// The VM's stats fd.
    pub vm_stats: Option<KvmStats>,
    /// The pager's counters, if paging.
    pub pager: Option<Box<dyn Fn() -> PagerStats + Send + Sync>>,
    /// The report of the governor running now, if any.
    pub governor: Arc<Mutex<Option<GovernorSource>>>,
    /// The booster, when boosting is on.
    pub boost: Option<Arc<crate::sched::boost::Booster>>,
    /// The I/O device.
    pub io: Arc<PvioDevice>,
    /// The guest's own halt polling (`idle=haltpoll`).
    pub guest_poll: Option<Box<dyn Fn() -> GuestPoll + Send + Sync>>,
    /// The balloon's control, if the VM has a balloon.
    pub balloon: Option<Arc<crate::devices::virtio::balloon::BalloonControl>>,
    /// When the vCPUs started.
    pub started: Instant,
}

/// What serves a VM's API while it runs.
pub trait ApiHost: Send {
    /// Before the vCPUs start: take what to serve (a socket is bound here,
    /// unpublished, so that a path in the way fails the start).
    fn start(&mut self, sources: LiveSources, controller: Controller) -> Result<(), Error>;
    /// The vCPUs run: clients may find the API from now on.
    fn publish(&mut self) -> Result<(), Error>;
    /// The run has ended: stop serving (the socket goes; a slot keeps the
    /// run's last figures).
    fn stop(&mut self);
}
