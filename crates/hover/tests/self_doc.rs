//! The CLI explains itself: completions and man pages are generated, `hover
//! workloads` lists the guest's table, enum flags list their values, logs
//! carry no colour codes when they are not a terminal, `hover ctl get`
//! shows halt polling, boosting and migration, and `hover ctl migrate`
//! prints progress lines into a log.

mod common;

use common::migrate::{finish, receiver};
use common::{hover, hover_cmd, text, Scratch, Vm};
use hover_abi::workload::{GLOBAL_PARAMS, WORKLOADS};
use hover_vmm::host::kvm_for_test;

#[test]
fn completions_and_man_pages_are_generated() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = hover(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        assert!(
            script.contains("migrate") && script.contains("dirty-tracking"),
            "{shell} completes subcommands and flags"
        );
    }
    let out = hover(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2), "an unknown shell is bad input");

    let out = hover(&["man"]);
    assert!(out.status.success());
    assert!(text(&out.stdout).contains(".TH hover 1"));
    let dir = Scratch::new("man");
    let pages = dir.path("pages");
    let out = hover(&["man", "--out", pages.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for page in [
        "hover.1",
        "hover-run.1",
        "hover-ctl-migrate.1",
        "hover-bench-snapshot.1",
    ] {
        let roff =
            std::fs::read_to_string(pages.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(roff.contains(".SH NAME"), "{page}");
    }
    let migrate = std::fs::read_to_string(pages.join("hover-ctl-migrate.1")).unwrap();
    assert!(
        migrate.contains("downtime"),
        "the page carries the flags' help"
    );
}

#[test]
fn hover_workloads_lists_the_guest_table() {
    let out = hover(&["workloads"]);
    assert!(out.status.success());
    let t = text(&out.stdout);
    for w in WORKLOADS {
        assert!(
            t.contains(&format!("\n{}\n    {}\n", w.name, w.help)),
            "{}",
            w.name
        );
        for p in w.params {
            assert!(
                t.contains(&format!("    {:<18} ", p.name)),
                "{}.{}",
                w.name,
                p.name
            );
        }
    }
    for p in GLOBAL_PARAMS {
        assert!(t.contains(p.help), "global {}", p.name);
    }
}

#[test]
fn enum_flags_list_their_values() {
    let help = text(&hover(&["ctl", "--api-socket", "x", "migrate", "--help"]).stdout);
    for values in [
        "[possible values: bitmap, manual, hybrid, ring]",
        "[possible values: precopy, postcopy, hybrid]",
        "[possible values: per-page, readv, persistent]",
    ] {
        assert!(help.contains(values), "{values} in {help}");
    }
    let out = hover(&[
        "ctl",
        "--api-socket",
        "x",
        "migrate",
        "--to",
        "unix:/x",
        "--dirty-tracking",
        "dirty",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("bitmap"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_log_that_is_not_a_terminal_has_no_colour_codes() {
    if !kvm_for_test("a_log_that_is_not_a_terminal_has_no_colour_codes") {
        return;
    }
    let out = hover_cmd()
        .env("RUST_LOG", "debug")
        .args(["run", "--cmdline", "workload=hello", "--console", "off"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let log = text(&out.stderr);
    assert!(log.contains("DEBUG"), "debug lines were logged: {log}");
    assert!(!log.contains('\u{1b}'), "no escape codes: {log}");
}

#[test]
fn ctl_shows_the_vm_and_a_migration_in_a_log() {
    if !kvm_for_test("ctl_shows_the_vm_and_a_migration_in_a_log") {
        return;
    }
    let dir = Scratch::new("ctl-self-doc");
    let args = [
        "run",
        "--halt-poll",
        "auto",
        "--boost",
        "on",
        "--cmdline",
        "workload=kvstore wss=8M rate=100 seconds=12",
    ];
    let src = Vm::spawn(&args, &dir.path("src.sock"));
    let sock = src.socket.to_str().unwrap().to_string();
    let ctl = |a: &[&str]| {
        let mut all = vec!["ctl", "--api-socket", sock.as_str()];
        all.extend_from_slice(a);
        hover(&all)
    };
    let get = ctl(&["get"]);
    assert!(get.status.success(), "{}", text(&get.stderr));
    let g = text(&get.stdout);
    for line in [
        "halt polling: governor",
        "boosting: dynamic, policy fifo:10",
        "migration: none under way",
    ] {
        assert!(g.contains(line), "{line} in {g}");
    }
    // Metrics are text only: --json is refused, not ignored.
    let m = ctl(&["--json", "metrics"]);
    assert_eq!(m.status.code(), Some(2));
    assert!(
        text(&m.stderr).contains("--json stats"),
        "{}",
        text(&m.stderr)
    );

    // 8 MiB at 8 MB/s: the migration lasts a second or more, so the progress
    // poller (every 100 ms) certainly sees it under way.
    let (dest, at) = receiver(&format!("unix:{}", dir.path("in.sock").display()));
    let out = ctl(&["migrate", "--to", &at, "--bandwidth", "8M"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let log = text(&out.stderr);
    assert!(
        log.contains("hover: migrating: round "),
        "progress lines: {log}"
    );
    assert!(!log.contains('\u{1b}'), "no escape codes: {log}");
    let (code, o, stderr) = src.wait();
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(o["ended"], "migrated");
    let (code, _, stderr) = finish(dest);
    assert_eq!(code, Some(0), "{stderr}");
}
