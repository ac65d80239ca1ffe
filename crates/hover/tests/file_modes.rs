//! What Hover creates is the owner's only, whatever the umask: the API
//! socket, the snapshot (all of guest memory), the I/O file it creates, and
//! the socket `hover receive` listens on, each 0600 under umask 000.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{hover_cmd_umask0, Scratch};
use hover_vmm::api::ApiClient;
use hover_vmm::host::kvm_for_test;

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
}

fn wait_for(p: &Path) {
    let until = Instant::now() + Duration::from_secs(30);
    while !p.exists() {
        assert!(Instant::now() < until, "{p:?} never appeared");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `hover ARGS` with umask 000.
fn hover_umask0(args: &[&str]) -> std::process::Child {
    hover_cmd_umask0()
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn files_and_sockets_are_0600_whatever_the_umask() {
    if !kvm_for_test("files_and_sockets_are_0600_whatever_the_umask") {
        return;
    }
    let dir = Scratch::new("modes");
    let (sock, io, snap) = (dir.path("vm.sock"), dir.path("vm.io"), dir.path("vm.snap"));
    let mut vm = hover_umask0(&[
        "run",
        "--api-socket",
        sock.to_str().unwrap(),
        "--io-file",
        io.to_str().unwrap(),
        "--console",
        "off",
        "--cmdline",
        "workload=iolat seconds=600",
    ]);
    wait_for(&sock);
    wait_for(&io);
    assert_eq!(mode(&sock), 0o600, "the API socket");
    assert_eq!(mode(&io), 0o600, "the I/O file");
    let api = ApiClient::new(&sock, Duration::from_secs(60));
    let body = serde_json::json!({ "path": snap, "stop": true }).to_string();
    api.json("PUT", "/vm/snapshot", Some(&body)).unwrap();
    assert_eq!(mode(&snap), 0o600, "the snapshot");
    assert!(vm.wait().unwrap().success());

    let listen = dir.path("in.sock");
    let mut rx = hover_umask0(&["receive", "--listen", &format!("unix:{}", listen.display())]);
    wait_for(&listen);
    assert_eq!(mode(&listen), 0o600, "the receiver's socket");
    rx.kill().unwrap();
    let _ = rx.wait();
}
