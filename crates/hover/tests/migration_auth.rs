//! Authenticated migration (docs/MIGRATION.md, "Who may migrate"): over
//! TCP both VMMs prove the same `--migration-key` before any state moves,
//! and every frame carries a MAC; a wrong key or none is refused before
//! the receiver reads any state (and it waits on for its real migration);
//! a flipped byte is refused by the MAC; TCP without a key only with
//! `--insecure`; key files are checked.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::migrate::{finish, new_key as key, receiver_with};
use common::proxy::{Fault, Proxy};
use common::{hover, report, text, Scratch, Vm};
use hover_vmm::host::kvm_for_test;

/// A kvstore guest that proves `key` (if any) when it migrates.
fn source(dir: &Scratch, name: &str, key: Option<&Path>) -> Vm {
    let mut args = vec![
        "run",
        "--cmdline",
        "workload=kvstore wss=16M rate=1000 seconds=6",
    ];
    if let Some(k) = key {
        args.extend(["--migration-key", k.to_str().unwrap()]);
    }
    Vm::spawn(&args, &dir.path(&format!("{name}.sock")))
}

#[test]
fn tcp_migration_proves_a_shared_key_and_refuses_any_other() {
    if !kvm_for_test("tcp_migration_proves_a_shared_key_and_refuses_any_other") {
        return;
    }
    let dir = Scratch::new("auth");
    let (a, b) = (key(&dir, "a.key"), key(&dir, "b.key"));
    let (dest, at) = receiver_with("tcp:127.0.0.1:0", &["--migration-key", a.to_str().unwrap()]);
    let migrate = |vm: &Vm, extra: serde_json::Value| {
        let mut body = serde_json::json!({ "to": at, "verify": true });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        vm.api()
            .call("PUT", "/vm/migrate", Some(&body.to_string()))
            .unwrap()
    };
    let still_running = |vm: &Vm| {
        let v = vm.api().json("GET", "/vm", None).unwrap();
        assert_eq!(v["state"], "running", "{v}");
    };

    // Another key: the source finds the destination's proof wrong.
    let other = source(&dir, "b", Some(&b));
    let r = migrate(&other, serde_json::json!({}));
    assert_eq!(r.status, 502, "{}", r.body);
    assert!(
        r.body.contains("does not hold this migration key"),
        "{}",
        r.body
    );
    still_running(&other);

    // No key: refused here before connecting, unless insecure; then the
    // receiver refuses it.
    let keyless = source(&dir, "n", None);
    let r = migrate(&keyless, serde_json::json!({}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("--migration-key"), "{}", r.body);
    let r = migrate(&keyless, serde_json::json!({ "insecure": true }));
    assert_eq!(r.status, 502, "{}", r.body);
    assert!(
        r.body.contains("requires an authenticated migration"),
        "{}",
        r.body
    );
    still_running(&keyless);

    // The same key: it moves, every frame authenticated.
    let src = source(&dir, "a", Some(&a));
    std::thread::sleep(Duration::from_millis(300));
    let r = migrate(&src, serde_json::json!({}));
    assert_eq!(r.status, 200, "{}", r.body);
    let rep: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(rep["authenticated"], true, "{rep}");
    let (code, o, stderr) = src.wait();
    assert_eq!(
        (code, &o["ended"]),
        (Some(0), &"migrated".into()),
        "{stderr}"
    );
    let (code, o, stderr) = finish(dest);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(report(&o, "kvstore.errors"), 0);
    // Both refusals were the handshake's: no state was read for them.
    assert_eq!(
        stderr.matches("failed the handshake").count(),
        2,
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("authentication failed").count(),
        2,
        "{stderr}"
    );
    for vm in [other, keyless] {
        let (code, _, stderr) = vm.wait();
        assert_eq!(
            code,
            Some(0),
            "the refused sources run to their end: {stderr}"
        );
    }
}

#[test]
fn a_flipped_byte_in_an_authenticated_stream_is_refused() {
    if !kvm_for_test("a_flipped_byte_in_an_authenticated_stream_is_refused") {
        return;
    }
    let dir = Scratch::new("auth-flip");
    let k = key(&dir, "k.key");
    let listen = dir.path("in.sock");
    let (dest, _) = receiver_with(
        &format!("unix:{}", listen.display()),
        &["--migration-key", k.to_str().unwrap()],
    );
    let via = dir.path("proxy.sock");
    // Past the hello, the proofs and the configuration: inside the pages.
    let _proxy = Proxy::with_fault(&via, &listen, Fault::FlipAt(300_000));
    let src = source(&dir, "src", Some(&k));
    std::thread::sleep(Duration::from_millis(300));
    let body = serde_json::json!({ "to": format!("unix:{}", via.display()), "timeout_s": 10 });
    let r = src
        .api()
        .call("PUT", "/vm/migrate", Some(&body.to_string()))
        .unwrap();
    assert!(r.status >= 500, "{}", r.body);
    let v = src.api().json("GET", "/vm", None).unwrap();
    assert_eq!(v["state"], "running", "{v}");
    let (code, o, stderr) = finish(dest);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(o.is_null(), "nothing ran there: {o}");
    assert!(stderr.contains("fails its MAC"), "{stderr}");
    let (code, _, stderr) = src.wait();
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn tcp_without_a_key_needs_insecure_and_key_files_are_checked() {
    let dir = Scratch::new("auth-cli");
    // A receiver over TCP with neither: refused before it listens.
    let out = hover(&["receive", "--listen", "tcp:127.0.0.1:0"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let e = text(&out.stderr);
    assert!(
        e.contains("--migration-key") && e.contains("--insecure"),
        "{e}"
    );
    // A new key is the owner's only and never overwritten.
    let k = key(&dir, "k.key");
    let mode = std::fs::metadata(&k).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let out = hover(&["migration-key", k.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("already exists"));
    // A key others may read, or too short a secret: refused with the fix.
    std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o640)).unwrap();
    let out = hover(&["run", "--migration-key", k.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("chmod 600"),
        "{}",
        text(&out.stderr)
    );
    let short = dir.path("short.key");
    std::fs::write(&short, "hunter2\n").unwrap();
    std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = hover(&["run", "--migration-key", short.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("at least 32"),
        "{}",
        text(&out.stderr)
    );
}
