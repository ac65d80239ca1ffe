//! The `hybrid` tracker: seed 4's combined dirty logging, on x86.
//!
//! The seed keeps hardware dirty-bit logging for memory the guest writes
//! all the time and write-protection for the rest. KVM on x86 has no
//! hardware dirty bits for us, but the cost the seed avoids is the same:
//! re-protecting a page the guest writes again at once buys a write fault
//! per round and sends the page every round anyway. So memory is tracked in
//! sections of 64 pages (one bitmap word); a section dirty in two rounds in
//! a row becomes **hot**: it is no longer re-protected (no write faults for
//! the guest), is not sent in the rounds, and counts as wholly dirty for the
//! final round. Every few rounds a hot section is **probed**: sent whole and
//! re-protected; if the guest did not write it in the next round, it is
//! demoted. Hot memory is bounded by a budget the engine sets from the
//! measured link rate and the downtime target, so the final round still
//! fits. Built on the manual-protect log, so a harvest costs what is dirty.

use std::sync::Arc;

use kvm_ioctls::VmFd;

use super::manual::{dirty_runs, ManualLog};
use super::{bits_to_gpas, DirtyError, DirtyTracker};
use crate::memory::GuestRam;
use hover_abi::layout::PAGE_SIZE;

/// Pages per section: one word of KVM's dirty bitmap.
pub const SECTION_PAGES: u64 = 64;
/// Rounds in a row a section must be dirty to become hot.
const HOT_AFTER: u8 = 2;
/// A hot section is probed every this many rounds.
const PROBE_EVERY: u32 = 4;

/// What to do with a section this round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing written: nothing to send.
    Skip,
    /// Send its dirty pages and re-protect them.
    Send,
    /// Send all of it and re-protect it: a hot section being probed.
    SendWhole,
    /// Hot: leave it unprotected, send it in the final round.
    Hold,
}

/// The hot/cold state of every section (pure logic, unit-tested).
#[derive(Clone, Debug, Default)]
pub struct HotSections {
    streak: Vec<u8>,
    hot: Vec<bool>,
    /// Probed last round: its next dirtiness decides.
    probing: Vec<bool>,
    since_probe: Vec<u32>,
    hot_count: usize,
    budget: usize,
}

impl HotSections {
    /// `n` sections, all cold; no hot budget yet.
    pub fn new(n: usize) -> Self {
        HotSections {
            streak: vec![0; n],
            hot: vec![false; n],
            probing: vec![false; n],
            since_probe: vec![0; n],
            hot_count: 0,
            budget: 0,
        }
    }

    /// How many sections may be hot at once.
    pub fn set_budget(&mut self, sections: usize) {
        self.budget = sections;
    }

    /// Sections hot now.
    pub fn hot_count(&self) -> usize {
        self.hot_count
    }

    /// Whether section `i` is hot.
    pub fn is_hot(&self, i: usize) -> bool {
        self.hot[i]
    }

    /// One round: `dirty[i]` says whether section `i`'s bitmap word has bits
    /// set. Returns what to do with each.
    pub fn step(&mut self, dirty: &[bool]) -> Vec<Action> {
        let mut out = Vec::with_capacity(dirty.len());
        for (i, &d) in dirty.iter().enumerate() {
            let a = if self.hot[i] {
                if self.probing[i] {
                    self.probing[i] = false;
                    if d {
                        // Written again since the probe: still hot.
                        Action::Hold
                    } else {
                        self.hot[i] = false;
                        self.hot_count -= 1;
                        self.streak[i] = 0;
                        Action::Skip
                    }
                } else if self.hot_count > self.budget {
                    // Over budget (it shrank): demote, send it whole.
                    self.hot[i] = false;
                    self.hot_count -= 1;
                    self.streak[i] = 0;
                    Action::SendWhole
                } else {
                    self.since_probe[i] += 1;
                    if self.since_probe[i] >= PROBE_EVERY {
                        self.since_probe[i] = 0;
                        self.probing[i] = true;
                        Action::SendWhole
                    } else {
                        Action::Hold
                    }
                }
            } else if d {
                self.streak[i] = self.streak[i].saturating_add(1);
                if self.streak[i] >= HOT_AFTER && self.hot_count < self.budget {
                    self.hot[i] = true;
                    self.hot_count += 1;
                    self.since_probe[i] = 0;
                    Action::Hold
                } else {
                    Action::Send
                }
            } else {
                self.streak[i] = 0;
                Action::Skip
            };
            out.push(a);
        }
        out
    }
}

/// See the module documentation.
pub struct HybridTracker {
    log: ManualLog,
    /// One per slot.
    sections: Vec<HotSections>,
}

impl HybridTracker {
    /// A tracker for `vm`'s RAM.
    pub fn new(vm: Arc<VmFd>, ram: &GuestRam) -> Self {
        let log = ManualLog::new(vm, ram, "hybrid");
        let sections = log
            .slots
            .iter()
            .map(|s| HotSections::new((s.len / PAGE_SIZE).div_ceil(SECTION_PAGES) as usize))
            .collect();
        HybridTracker { log, sections }
    }

    fn section_gpas(&self, k: usize, w: usize, out: &mut Vec<u64>) {
        let s = &self.log.slots[k];
        let first = s.gpa + w as u64 * SECTION_PAGES * PAGE_SIZE;
        let end = (first + SECTION_PAGES * PAGE_SIZE).min(s.gpa + s.len);
        out.extend((first..end).step_by(PAGE_SIZE as usize));
    }
}

impl DirtyTracker for HybridTracker {
    fn name(&self) -> &'static str {
        "hybrid"
    }

    fn start(&mut self) -> Result<(), DirtyError> {
        self.log.start()
    }

    fn harvest(&mut self) -> Result<Vec<u64>, DirtyError> {
        let mut out = Vec::new();
        for (k, mut bits) in self.log.read()?.into_iter().enumerate() {
            let dirty: Vec<bool> = bits.iter().map(|&w| w != 0).collect();
            let actions = self.sections[k].step(&dirty);
            let base = self.log.slots[k].gpa;
            for (w, a) in actions.iter().enumerate() {
                match a {
                    Action::Send => {
                        bits_to_gpas(&bits[w..w + 1], base + w as u64 * 64 * PAGE_SIZE, &mut out)
                    }
                    Action::SendWhole => {
                        self.section_gpas(k, w, &mut out);
                        // Re-protect the whole section.
                        bits[w] = u64::MAX;
                    }
                    // Not re-protected: leave the word out of the clear.
                    Action::Hold | Action::Skip => bits[w] = 0,
                }
            }
            for (from, to) in dirty_runs(&bits) {
                self.log.clear_words(k, &bits, from, to)?;
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    fn harvest_final(&mut self) -> Result<Vec<u64>, DirtyError> {
        let mut out = self.harvest()?;
        for k in 0..self.sections.len() {
            for w in 0..self.sections[k].hot.len() {
                if self.sections[k].is_hot(w) {
                    self.section_gpas(k, w, &mut out);
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    fn deferred_pages(&self) -> u64 {
        self.sections
            .iter()
            .map(|s| s.hot_count() as u64 * SECTION_PAGES)
            .sum()
    }

    fn set_deferral_budget(&mut self, pages: u64) {
        let n = self.sections.len().max(1) as u64;
        for s in &mut self.sections {
            s.set_budget((pages / SECTION_PAGES / n) as usize);
        }
    }

    fn stop(&mut self) {
        self.log.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action::*;

    #[test]
    fn a_section_dirty_twice_in_a_row_becomes_hot_and_is_held() {
        let mut h = HotSections::new(2);
        h.set_budget(10);
        assert_eq!(h.step(&[true, false]), vec![Send, Skip]);
        assert_eq!(h.step(&[true, true]), vec![Hold, Send]);
        assert!(h.is_hot(0) && !h.is_hot(1));
        assert_eq!(h.hot_count(), 1);
        // Hot sections are held whatever their bits say, until probed.
        assert_eq!(h.step(&[true, false]), vec![Hold, Skip]);
        assert_eq!(h.step(&[true, false]), vec![Hold, Skip]);
    }

    #[test]
    fn a_probed_hot_section_that_stays_quiet_is_demoted() {
        let mut h = HotSections::new(1);
        h.set_budget(1);
        h.step(&[true]);
        assert_eq!(h.step(&[true]), vec![Hold]);
        // Rounds until the probe: held; then sent whole and re-protected.
        let mut seen = Vec::new();
        for _ in 0..PROBE_EVERY {
            seen.push(h.step(&[true])[0]);
        }
        assert_eq!(seen.last(), Some(&SendWhole), "{seen:?}");
        // Quiet after the probe: cold again.
        assert_eq!(h.step(&[false]), vec![Skip]);
        assert!(!h.is_hot(0));
        assert_eq!(h.hot_count(), 0);
    }

    #[test]
    fn a_probed_hot_section_written_again_stays_hot() {
        let mut h = HotSections::new(1);
        h.set_budget(1);
        h.step(&[true]);
        h.step(&[true]);
        for _ in 0..PROBE_EVERY {
            h.step(&[true]);
        }
        assert_eq!(h.step(&[true]), vec![Hold]);
        assert!(h.is_hot(0));
    }

    #[test]
    fn hot_memory_stays_within_its_budget() {
        let mut h = HotSections::new(4);
        h.set_budget(2);
        h.step(&[true; 4]);
        assert_eq!(h.step(&[true; 4]), vec![Hold, Hold, Send, Send]);
        assert_eq!(h.hot_count(), 2);
        // A smaller budget demotes (and sends whole) what no longer fits.
        h.set_budget(1);
        let a = h.step(&[true; 4]);
        assert_eq!(a[0], SendWhole);
        assert_eq!(h.hot_count(), 1);
        // No budget: nothing becomes hot.
        let mut cold = HotSections::new(1);
        cold.step(&[true]);
        assert_eq!(cold.step(&[true]), vec![Send]);
    }
}
