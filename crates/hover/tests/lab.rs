//! The built-in guest on hardware-style KVM, in the KVM lab
//! (`scripts/lab/builtin.sh`; `common::lab` says how a scenario runs).

mod common;

use common::lab::{assert_ok, Cell};

static RUN: Cell = Cell::new();

#[test]
fn the_builtin_guest_says_hello_on_hardware_kvm() {
    assert_ok(&RUN, "builtin", "hello", "hello");
}

#[test]
fn spin_runs_on_two_vcpus_on_hardware_kvm() {
    assert_ok(&RUN, "builtin", "spin", "spin-2-vcpus");
}

#[test]
fn memtouch_under_a_budget_is_paged_and_intact_on_hardware_kvm() {
    assert_ok(&RUN, "builtin", "memtouch", "memtouch-budget");
}

#[test]
fn a_paused_vm_resumes_and_its_guest_ends_well_on_hardware_kvm() {
    assert_ok(&RUN, "builtin", "pause", "pause-resume");
    assert_ok(&RUN, "builtin", "pause", "pause-resume-guest-ends");
}

#[test]
fn a_snapshot_restores_eagerly_on_hardware_kvm() {
    assert_ok(&RUN, "builtin", "restore eager", "restore-eager");
}

#[test]
fn a_snapshot_restores_lazily_on_hardware_kvm() {
    assert_ok(&RUN, "builtin", "restore lazy", "restore-lazy");
}

#[test]
fn a_snapshot_restores_by_prefetch_on_hardware_kvm() {
    assert_ok(&RUN, "builtin", "restore prefetch", "restore-prefetch");
}

#[test]
fn a_precopy_migration_moves_the_guest_on_hardware_kvm() {
    assert_ok(&RUN, "builtin", "precopy", "migrate-precopy");
    assert_ok(&RUN, "builtin", "precopy", "migrate-precopy-guest-ends");
}

#[test]
fn a_postcopy_migration_moves_the_guest_on_hardware_kvm() {
    assert_ok(&RUN, "builtin", "postcopy", "migrate-postcopy");
    assert_ok(&RUN, "builtin", "postcopy", "migrate-postcopy-guest-ends");
}

/// The same scenario on Debian 12's own kernel, 6.1, which has no
/// UFFDIO_MOVE: the pager evicts by write-protection there
/// (`--pager-evict auto`), and restores and post-copy fetch with
/// UFFDIO_COPY alone.
static ON_6_1: Cell = Cell::new();

#[test]
fn on_a_6_1_host_the_pager_evicts_by_write_protection_and_memtouch_is_intact() {
    assert_ok(&ON_6_1, "builtin@6.1", "memtouch", "memtouch-budget");
    assert_ok(
        &ON_6_1,
        "builtin@6.1",
        "memtouch",
        "memtouch-evicts-by-write-protect",
    );
}

#[test]
fn on_a_6_1_host_snapshots_restore_lazily_and_by_prefetch() {
    for mode in ["lazy", "prefetch"] {
        assert_ok(&ON_6_1, "builtin@6.1", mode, &format!("restore-{mode}"));
    }
}

#[test]
fn on_a_6_1_host_a_postcopy_migration_moves_the_guest() {
    assert_ok(&ON_6_1, "builtin@6.1", "postcopy", "migrate-postcopy");
    assert_ok(
        &ON_6_1,
        "builtin@6.1",
        "postcopy",
        "migrate-postcopy-guest-ends",
    );
}

#[test]
fn on_a_6_8_or_later_host_the_pager_evicts_by_uffdio_move() {
    assert_ok(&RUN, "builtin", "memtouch", "memtouch-evicts-by-move");
}

static RETRY: Cell = Cell::new();

/// The harness's own retry: a run that failed with a vCPU's triple fault
/// reported in it is made again (the scenario fails its first attempt so).
#[test]
fn a_lab_run_lost_to_a_triple_fault_is_made_again() {
    let t = "a_lab_run_lost_to_a_triple_fault_is_made_again";
    assert_ok(&RETRY, "lab-retry", t, "retried-after-a-triple-fault");
}
