//! The shared areas: registration (checked, since the guest is not
//! trusted), taking them up after a restore, and the loads and stores of
//! their fields.

use std::sync::atomic::Ordering;

use hover_abi::boost::{offset, request, BOOST_AREA_SIZE, BOOST_AREA_VERSION};
use hover_abi::control::status as control_status;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use super::{Booster, NO_AREA};

/// Saved boost-area registrations that do not fit this VM.
#[derive(Debug, thiserror::Error)]
pub enum AreaRestoreError {
    /// More areas than vCPUs.
    #[error("{saved} saved boost areas for {vcpus} vCPUs")]
    TooMany {
        /// Areas saved.
        saved: usize,
        /// vCPUs here.
        vcpus: usize,
    },
    /// An area not aligned or not in guest RAM.
    #[error("saved boost area of vCPU {vcpu}: {why}")]
    Misplaced {
        /// Its vCPU.
        vcpu: usize,
        /// What is wrong with its address.
        why: String,
    },
}

impl Booster {
    pub(super) fn area(&self, vcpu: usize) -> Option<u64> {
        let a = self.slots.get(vcpu)?.area.load(Ordering::Acquire);
        (a != NO_AREA).then_some(a)
    }

    /// The registered areas (for a snapshot): gpa per vCPU.
    pub fn areas(&self) -> Vec<Option<u64>> {
        (0..self.slots.len()).map(|v| self.area(v)).collect()
    }

    /// A guest request `BOOST_REGISTER` from vCPU `vcpu`: the area at `gpa`
    /// of layout `version`. Returns the control status. Accepted whatever
    /// the mode (only dynamic boosting acts on it), so that boosting can be
    /// switched on while the VM runs; the guest's bits cost it no exit.
    pub fn register(&self, vcpu: usize, gpa: u64, version: u64) -> u32 {
        match self.check_area(gpa, version) {
            Ok(()) => {
                self.write_u32(gpa + offset::STATUS, 0);
                self.write_u32(gpa + offset::KEEP_US, 0);
                self.write_u64(gpa + offset::BOOSTS, 0);
                self.slots[vcpu].area.store(gpa, Ordering::Release);
                self.lock(vcpu).stats.registered = true;
                tracing::debug!(vcpu, "boost area registered at {gpa:#x}");
                control_status::OK
            }
            Err((st, why)) => {
                tracing::warn!(
                    vcpu,
                    "boost area registration refused: {why}; the vCPU runs unboosted"
                );
                st
            }
        }
    }

    pub(super) fn check_bounds(&self, gpa: u64) -> Result<(), (u32, String)> {
        let range = control_status::BAD_RANGE;
        if !gpa.is_multiple_of(BOOST_AREA_SIZE) {
            return Err((
                range,
                format!("{gpa:#x} is not {BOOST_AREA_SIZE}-byte aligned"),
            ));
        }
        let end = gpa.checked_add(BOOST_AREA_SIZE - 1);
        if end.is_none_or(|e| !self.guest.memory().address_in_range(GuestAddress(e)))
            || !self.guest.memory().address_in_range(GuestAddress(gpa))
        {
            return Err((range, format!("{gpa:#x} lies outside guest RAM")));
        }
        Ok(())
    }

    pub(super) fn check_area(&self, gpa: u64, version: u64) -> Result<(), (u32, String)> {
        self.check_bounds(gpa)?;
        let range = control_status::BAD_RANGE;
        let record = control_status::BAD_RECORD;
        let in_area: u32 = self
            .guest
            .memory()
            .read_obj(GuestAddress(gpa + offset::VERSION))
            .map_err(|e| (range, e.to_string()))?;
        if version != BOOST_AREA_VERSION as u64 || in_area != BOOST_AREA_VERSION {
            return Err((
                record,
                format!(
                    "layout version {version} (area says {in_area}); this monitor reads {BOOST_AREA_VERSION}"
                ),
            ));
        }
        let bits = self.read_request(gpa);
        if bits & !request::ALL != 0 {
            return Err((
                record,
                format!(
                    "request bits {bits:#x} outside the ABI's {:#x}",
                    request::ALL
                ),
            ));
        }
        Ok(())
    }

    /// Take up registrations saved with the VM (restore, migration). The
    /// areas' contents came with guest memory; a pause unboosted every
    /// thread before the state was saved, so no area claims a boost, and
    /// guest memory is not touched here (a lazy restore has not fetched it).
    pub fn restore(&self, areas: &[Option<u64>]) -> Result<(), AreaRestoreError> {
        if areas.len() > self.slots.len() {
            return Err(AreaRestoreError::TooMany {
                saved: areas.len(),
                vcpus: self.slots.len(),
            });
        }
        for (v, a) in areas.iter().enumerate() {
            let Some(gpa) = *a else { continue };
            self.check_bounds(gpa)
                .map_err(|(_, why)| AreaRestoreError::Misplaced { vcpu: v, why })?;
            self.slots[v].area.store(gpa, Ordering::Release);
            self.lock(v).stats.registered = true;
        }
        Ok(())
    }

    pub(super) fn read_request(&self, gpa: u64) -> u32 {
        self.guest
            .memory()
            .load::<u32>(GuestAddress(gpa + offset::REQUEST), Ordering::Acquire)
            .unwrap_or(0)
    }

    /// The guest's count of quiet unboosts.
    pub(super) fn read_quiet_unboosts(&self, gpa: u64) -> u64 {
        self.guest
            .memory()
            .load::<u64>(
                GuestAddress(gpa + offset::QUIET_UNBOOSTS),
                Ordering::Acquire,
            )
            .unwrap_or(0)
    }

    pub(super) fn read_wake_at(&self, gpa: u64) -> u64 {
        self.guest
            .memory()
            .load::<u64>(GuestAddress(gpa + offset::WAKE_AT), Ordering::Acquire)
            .unwrap_or(0)
    }

    pub(super) fn write_u32(&self, gpa: u64, v: u32) {
        let _ = self.guest.store(v, gpa, Ordering::Release);
    }

    pub(super) fn write_u64(&self, gpa: u64, v: u64) {
        let _ = self.guest.store(v, gpa, Ordering::Release);
    }

    pub(super) fn set_status(&self, vcpu: usize, set: u32, clear: u32) {
        if let Some(gpa) = self.area(vcpu) {
            let addr = GuestAddress(gpa + offset::STATUS);
            let old = self
                .guest
                .memory()
                .load::<u32>(addr, Ordering::Acquire)
                .unwrap_or(0);
            self.write_u32(gpa + offset::STATUS, (old | set) & !clear);
        }
    }

    /// The guest's request bits, unknown ones dropped (and logged once).
    pub(super) fn requested(&self, vcpu: usize, gpa: u64) -> u32 {
        let bits = self.read_request(gpa);
        if bits & !request::ALL != 0 {
            let mut s = self.lock(vcpu);
            if !s.warned_bits {
                s.warned_bits = true;
                tracing::warn!(
                    vcpu,
                    "the guest set boost request bits {bits:#x} outside the ABI; the unknown ones are ignored"
                );
            }
        }
        bits & request::ALL
    }
}
