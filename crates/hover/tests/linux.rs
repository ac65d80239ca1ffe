//! A stock Linux kernel under Hover on hardware-style KVM, in the KVM lab
//! (`scripts/lab/linux.sh`: Debian's 6.1 cloud kernel with a busybox
//! initramfs; `common::lab` says how a scenario runs).

mod common;

use common::lab::{assert_ok, Cell};

static RUN: Cell = Cell::new();

#[test]
fn a_linux_guest_boots_to_its_init_and_prints_a_line() {
    assert_ok(&RUN, "linux", "boot", "linux-boots-to-init");
}

#[test]
fn a_linux_guest_sees_two_cpus() {
    assert_ok(&RUN, "linux", "cpus", "linux-sees-2-cpus");
}

#[test]
fn poweroff_in_the_guest_ends_the_run_with_power_off_and_exit_0() {
    assert_ok(&RUN, "linux", "poweroff", "linux-poweroff-ends-power-off");
    assert_ok(&RUN, "linux", "poweroff", "linux-poweroff-exit-0");
}

#[test]
fn reboot_in_the_guest_ends_the_run_with_reboot() {
    assert_ok(&RUN, "linux", "reboot", "linux-reboot-ends-reboot");
}

#[test]
fn a_linux_guest_asked_to_poll_loads_cpuidle_haltpoll_with_the_limit_hover_gave() {
    assert_ok(
        &RUN,
        "linux",
        "guest polling",
        "linux-guest-polling-loads-cpuidle-haltpoll-when-asked",
    );
}

#[test]
fn kvm_polls_a_linux_guests_halts_by_the_vms_window_and_the_governor_decides() {
    assert_ok(
        &RUN,
        "linux",
        "window 0",
        "linux-halt-poll-window-0-polls-never",
    );
    assert_ok(&RUN, "linux", "window 10ms", "linux-halt-poll-window-polls");
    assert_ok(
        &RUN,
        "linux",
        "governor",
        "linux-halt-poll-governor-decides",
    );
}

#[test]
fn a_linux_guest_reads_a_disk_the_host_wrote() {
    assert_ok(
        &RUN,
        "linux",
        "disk read",
        "linux-reads-a-disk-the-host-wrote",
    );
}

#[test]
fn a_linux_guest_writes_a_disk_the_host_then_reads() {
    assert_ok(
        &RUN,
        "linux",
        "disk write",
        "linux-writes-a-disk-the-host-reads",
    );
}

#[test]
fn a_readonly_disk_refuses_the_guests_writes() {
    assert_ok(
        &RUN,
        "linux",
        "readonly",
        "linux-readonly-disk-refuses-writes",
    );
}

#[test]
fn a_linux_guest_gets_entropy_from_virtio_rng() {
    assert_ok(&RUN, "linux", "rng", "linux-gets-entropy");
}

#[test]
fn get_vm_shows_the_kernel_initrd_and_devices() {
    assert_ok(
        &RUN,
        "linux",
        "GET /vm",
        "linux-get-shows-kernel-initrd-and-disks",
    );
}

#[test]
fn a_linux_guest_pings_the_host_over_virtio_net_on_a_tap() {
    assert_ok(&RUN, "linux", "net", "linux-pings-the-l1-over-virtio-net");
    assert_ok(&RUN, "linux", "net", "linux-net-has-the-mac-given");
}

#[test]
fn a_tap_held_by_another_vm_or_missing_is_refused() {
    assert_ok(&RUN, "linux", "busy tap", "linux-net-busy-tap-refused");
    assert_ok(
        &RUN,
        "linux",
        "missing tap",
        "linux-net-missing-tap-refused",
    );
}

#[test]
fn console_stdio_types_to_a_linux_shell_and_ctrl_a_x_ends_the_vm() {
    assert_ok(
        &RUN,
        "linux",
        "stdio",
        "linux-console-stdio-reaches-the-shell",
    );
    assert_ok(&RUN, "linux", "stdio", "linux-console-ctrl-a-x-ends-the-vm");
}

#[test]
fn virtio_net_offloads_are_negotiated_and_tcp_crosses_intact_both_ways() {
    assert_ok(&RUN, "linux", "offloads", "linux-net-offloads-negotiated");
    assert_ok(&RUN, "linux", "tcp out", "linux-net-tcp-to-the-l1-intact");
    assert_ok(&RUN, "linux", "tcp in", "linux-net-tcp-from-the-l1-intact");
}

/// The network run is under `--boost on`: the card's interrupts are
/// raised by the I/O thread and boost the vCPU they reach, and Hover ends
/// each boost as the vCPU halts (a Linux guest shares no boost area).
#[test]
fn a_linux_guests_device_interrupts_boost_its_vcpu_and_hover_ends_each_boost() {
    assert_ok(
        &RUN,
        "linux",
        "host-side boosts",
        "linux-net-interrupts-boost-the-vcpu-and-hover-ends-each-boost",
    );
}

/// The Linux guest's state scenario (`scripts/lab/linux-state.sh`).
static STATE: Cell = Cell::new();

#[test]
fn a_paused_linux_guest_stands_still_and_goes_on_when_resumed() {
    assert_ok(
        &STATE,
        "linux-state",
        "pause",
        "linux-pause-holds-the-guest",
    );
    assert_ok(&STATE, "linux-state", "resume", "linux-resume-goes-on");
}

#[test]
fn a_linux_guest_restored_eagerly_lazily_and_by_prefetch_goes_on_with_its_clock_and_disk() {
    assert_ok(
        &STATE,
        "linux-state",
        "snapshot",
        "linux-snapshot-disk-holds-the-last-count",
    );
    for mode in ["eager", "lazy", "prefetch"] {
        for check in ["goes-on", "clock-not-backwards", "disk-written"] {
            assert_ok(
                &STATE,
                "linux-state",
                mode,
                &format!("linux-restore-{mode}-{check}"),
            );
        }
    }
}

#[test]
fn a_restore_without_the_vms_disk_or_with_one_of_another_size_is_refused() {
    assert_ok(
        &STATE,
        "linux-state",
        "no disk",
        "linux-restore-without-its-disk-refused",
    );
    assert_ok(
        &STATE,
        "linux-state",
        "small disk",
        "linux-restore-with-a-disk-of-another-size-refused",
    );
}

/// The Linux guest's live migrations (`scripts/lab/linux-migrate.sh`):
/// hop after hop between Hover processes in one L1.
static MIGRATE: Cell = Cell::new();

/// Every check of one hop: `--verify` passed, the counter went on from
/// where it stopped, the disk holds its last count, the destination
/// announced the guest's MAC on its tap, the guest reaches the L1 again.
fn hop_goes_on(hop: &str) {
    for check in [
        "migrates-with-verify",
        "goes-on",
        "disk-holds-the-last-count",
        "announces-the-mac",
        "network-goes-on",
    ] {
        assert_ok(&MIGRATE, "linux-migrate", hop, &format!("{hop}-{check}"));
    }
}

#[test]
fn a_linux_guest_migrated_by_precopy_with_the_bitmap_tracker_goes_on_with_its_disk_and_network() {
    hop_goes_on("linux-precopy-bitmap");
}

#[test]
fn a_linux_guest_migrated_by_precopy_with_manual_reprotection_goes_on_with_its_disk_and_network() {
    hop_goes_on("linux-precopy-manual");
}

#[test]
fn a_linux_guest_migrated_by_precopy_with_the_hybrid_tracker_goes_on_with_its_disk_and_network() {
    hop_goes_on("linux-precopy-hybrid");
}

#[test]
fn a_linux_guest_migrated_by_precopy_with_dirty_rings_goes_on_with_its_disk_and_network() {
    hop_goes_on("linux-precopy-ring");
}

#[test]
fn a_linux_guest_migrated_by_postcopy_goes_on_with_its_disk_and_network() {
    hop_goes_on("linux-postcopy");
}

#[test]
fn a_linux_guest_migrated_in_hybrid_mode_goes_on_with_its_disk_and_network() {
    hop_goes_on("linux-hybrid-mode");
}

/// The balloon scenario (`scripts/lab/linux-balloon.sh`): one VM with all
/// of its memory, one under a `--memory-budget` (the pager and the balloon
/// at once).
static BALLOON: Cell = Cell::new();

fn balloon(vm: &str, check: &str) {
    assert_ok(
        &BALLOON,
        "linux-balloon",
        vm,
        &format!("balloon-{vm}-{check}"),
    );
}

#[test]
fn a_linux_guests_free_pages_are_reported_and_dropped_and_its_statistics_arrive() {
    for vm in ["plain", "paged"] {
        for check in ["driver", "reporting", "statistics"] {
            balloon(vm, check);
        }
    }
    balloon("paged", "pager-dropped-pages");
    balloon("paged", "resident-shrank");
    balloon("paged", "store-shrank");
}

#[test]
fn a_linux_guest_inflates_and_deflates_the_balloon_to_the_target_set_live() {
    for vm in ["plain", "paged"] {
        for check in [
            "inflate",
            "inflated-pages-dropped",
            "guest-memtotal-down",
            "deflate",
            "guest-memtotal",
        ] {
            balloon(vm, check);
        }
    }
}

#[test]
fn memory_a_linux_guest_kept_is_intact_after_reports_and_inflation_with_and_without_the_pager() {
    for vm in ["plain", "paged"] {
        balloon(vm, "kept-memory-intact");
        balloon(vm, "ends-cleanly");
    }
}
