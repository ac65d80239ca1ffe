//! Overcommitted guest memory on /dev/kvm: the pager (userfaultfd, page
//! store, eviction) and asynchronous page faults, checked end to end.

mod common;

use hover_vmm::config::MachineConfig;
use hover_vmm::memory::paged::EvictMode;

use common::{boot, report};
use hover_vmm::host::kvm_for_test;
use hover_vmm::{RunOutcome, VmConfig};

fn paged(memory_mib: u64, budget_mib: u64, async_pf: bool, cmdline: &str) -> (RunOutcome, String) {
    paged_with(memory_mib, budget_mib, async_pf, cmdline, None)
}

fn paged_with(
    memory_mib: u64,
    budget_mib: u64,
    async_pf: bool,
    cmdline: &str,
    evict: Option<EvictMode>,
) -> (RunOutcome, String) {
    let mut config = VmConfig {
        machine: MachineConfig {
            vcpus: 2,
            memory: memory_mib << 20,
            memory_budget: Some(budget_mib << 20),
            async_pf,
            cmdline: cmdline.into(),
            ..Default::default()
        },
        ..VmConfig::default()
    };
    config.host.page_store.evict = evict;
    let (result, console) = boot(config);
    let o = result.unwrap_or_else(|e| panic!("{cmdline}: {e}\nconsole:\n{console}"));
    assert_eq!(o.exit_code, 0, "{cmdline}\nconsole:\n{console}");
    (o, console)
}

/// memtouch over 4x the budget: every byte verified, the checksum matches
/// the host's, pages went out to the store and came back; the guest sees
/// async "not present"/"ready" pairs with async PF on and none with it off.
#[test]
fn memtouch_over_four_times_the_budget_verifies() {
    if !kvm_for_test("memtouch_over_four_times_the_budget_verifies") {
        return;
    }
    for async_pf in [true, false] {
        let (o, _) = paged(
            128,
            16,
            async_pf,
            "workload=memtouch size=64M tasks=2 seed=3",
        );
        assert_verified(&o, 64 << 20, 3);
        let p = o.pager.as_ref().expect("pager stats with a budget");
        assert!(p.evictions > 8192, "most of the 64 MiB was evicted: {p:?}");
        assert!(
            p.store_reads > 8192,
            "and read back for the verify pass: {p:?}"
        );
        assert!(p.resident_pages <= p.budget_pages, "{p:?}");
        assert!(
            o.memory.guest_resident <= 20 << 20,
            "resident {} over the 16 MiB budget",
            o.memory.guest_resident
        );
        let not_present = o
            .reports
            .iter()
            .find(|r| r.key == "apf.not_present")
            .and_then(|r| r.value.as_u64());
        if async_pf {
            let np = not_present.expect("the guest reports async PF counters");
            assert!(np > 1000, "{np} async page faults");
            assert!(
                report(&o, "apf.ready") >= np,
                "every not-present got its ready"
            );
        } else {
            assert_eq!(
                not_present, None,
                "async PF off: the guest never enabled it"
            );
        }
    }
}

/// The pager without UFFDIO_MOVE (the path for hosts before Linux 6.8,
/// chosen here by hand): pages are write-protected, copied out and
/// dropped; memtouch over 4x the budget on 2 vCPUs, with and without async
/// PF, finds every byte it wrote.
#[test]
fn memtouch_over_the_budget_verifies_with_write_protect_eviction() {
    if !kvm_for_test("memtouch_over_the_budget_verifies_with_write_protect_eviction") {
        return;
    }
    for async_pf in [true, false] {
        let (o, _) = paged_with(
            128,
            16,
            async_pf,
            "workload=memtouch size=64M tasks=2 seed=7",
            Some(EvictMode::WriteProtect),
        );
        assert_verified(&o, 64 << 20, 7);
        let p = o.pager.as_ref().expect("pager stats with a budget");
        assert_eq!(p.evict_mode, "write-protect");
        assert!(p.evictions > 8192, "most of the 64 MiB was evicted: {p:?}");
        assert!(p.store_reads > 8192, "{p:?}");
        assert!(p.resident_pages <= p.budget_pages, "{p:?}");
    }
}

/// memtouch found every byte it wrote (seed `seed`) and its checksum is the
/// host's.
fn assert_verified(o: &RunOutcome, size: u64, seed: u64) {
    assert_eq!(report(o, "memtouch.errors"), 0);
    let base = report(o, "memtouch.base");
    let expected = (base..base + size).step_by(8).fold(0u64, |s, a| {
        s.wrapping_add(a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed)
    });
    assert_eq!(report(o, "memtouch.checksum"), expected);
}

/// `apf_min_us`: faults that wait less than the threshold on average turn
/// async PF off, and the tasks parked at that moment are woken and finish
/// their accesses (every byte verified). The threshold (1 s) is above any
/// fault's wait, and the run's 16384+ faults cannot all fall in windows of
/// fewer than 16 unless it lasts over 50 s, so a window decides "off".
#[test]
fn adaptive_async_pf_turns_itself_off_when_faults_are_fast() {
    if !kvm_for_test("adaptive_async_pf_turns_itself_off_when_faults_are_fast") {
        return;
    }
    let (o, console) = paged(
        128,
        16,
        true,
        "workload=memtouch size=64M tasks=2 seed=5 apf_min_us=1000000",
    );
    assert_verified(&o, 64 << 20, 5);
    assert!(report(&o, "apf.turned_off") >= 1, "{console}");
}

/// The monitor's own reads of guest memory (a control request and its
/// reports) work when those pages have been evicted.
#[test]
fn the_monitor_reads_evicted_pages() {
    if !kvm_for_test("the_monitor_reads_evicted_pages") {
        return;
    }
    let (o, console) = paged(96, 16, true, "workload=evict-report size=48M");
    assert!(console.contains("status 1"), "{console}");
    assert_eq!(report(&o, "evict.mark"), 0x0123_4567_89ab_cdef);
    let p = o.pager.as_ref().unwrap();
    assert!(p.evictions > 0 && p.store_reads > 0, "{p:?}");
}

/// Without a budget nothing is paged and no pager runs.
#[test]
fn no_budget_no_pager() {
    if !kvm_for_test("no_budget_no_pager") {
        return;
    }
    let (result, _) = boot(VmConfig {
        machine: MachineConfig {
            vcpus: 1,
            ..Default::default()
        },
        ..VmConfig::default()
    });
    assert!(result.unwrap().pager.is_none());
}
