//! An unfiltered thread that does, on behalf of the confined control
//! thread, the two things the `control` filter forbids it: starting the
//! migration's sender process (`execve`, and a new program's loader maps
//! executable memory) and resolving a host name (glibc's NSS may load a
//! library: executable mappings again). It is started before the control
//! thread is confined, so it carries no filter; it takes only these two
//! requests, from a channel, and starts no program but this executable's
//! own hidden helpers (`hover __NAME ...`): a confined thread that was made
//! to ask for a shell is refused.
//!
//! Without a broker (a library user that never confines its thread) both
//! run on the caller's thread as before.

use crate::sync::Locked;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::{Child, Command};
use std::sync::mpsc::{self, Sender};
use std::sync::{Mutex, OnceLock};

enum Request {
    Spawn(Box<Command>, Sender<io::Result<Child>>),
    Resolve(String, Sender<io::Result<Vec<SocketAddr>>>),
}

static BROKER: OnceLock<Mutex<Sender<Request>>> = OnceLock::new();

/// Whether the broker may start `cmd`: this executable (`exe`), with a
/// hidden helper's subcommand (`__NAME`) first.
fn allowed(cmd: &Command, exe: &std::path::Path) -> bool {
    cmd.get_program() == exe.as_os_str()
        && cmd
            .get_args()
            .next()
            .and_then(|a| a.to_str())
            .is_some_and(|a| a.starts_with("__"))
}

/// Start the broker (once per process; later calls do nothing). Call it
/// before the calling thread is confined.
pub fn start() -> io::Result<()> {
    if BROKER.get().is_some() {
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    let (tx, rx) = mpsc::channel::<Request>();
    std::thread::Builder::new()
        .name("hover-broker".into())
        .spawn(move || {
            for req in rx {
                match req {
                    Request::Spawn(mut cmd, answer) if allowed(&cmd, &exe) => {
                        let _ = answer.send(cmd.spawn());
                    }
                    Request::Spawn(cmd, answer) => {
                        let _ = answer.send(Err(io::Error::new(
                            io::ErrorKind::PermissionDenied,
                            format!(
                                "the broker starts only this executable's helpers, not {:?}",
                                cmd.get_program()
                            ),
                        )));
                    }
                    Request::Resolve(name, answer) => {
                        let _ = answer.send(name.to_socket_addrs().map(|a| a.collect()));
                    }
                }
            }
        })?;
    // Another thread may have won the race: its broker serves, this one's
    // channel closes and its thread ends.
    let _ = BROKER.set(Mutex::new(tx));
    Ok(())
}

fn ask<T>(make: impl FnOnce(Sender<io::Result<T>>) -> Request) -> Option<io::Result<T>> {
    let broker = BROKER.get()?;
    let (tx, rx) = mpsc::channel();
    let sent = broker.locked().send(make(tx));
    Some(match sent {
        Ok(()) => rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("the broker thread is gone"))),
        Err(_) => Err(io::Error::other("the broker thread is gone")),
    })
}

/// Start `cmd` (through the broker if there is one: then only this
/// executable's hidden helpers).
pub fn spawn(cmd: Command) -> io::Result<Child> {
    let mut cmd = Box::new(cmd);
    match BROKER.get() {
        Some(_) => ask(|tx| Request::Spawn(cmd, tx)).expect("a broker was started"),
        None => cmd.spawn(),
    }
}

/// The addresses of `host:port` (through the broker if there is one).
pub fn resolve(name: &str) -> io::Result<Vec<SocketAddr>> {
    // A numeric address needs no lookup.
    if let Ok(a) = name.parse::<SocketAddr>() {
        return Ok(vec![a]);
    }
    match ask(|tx| Request::Resolve(name.to_string(), tx)) {
        Some(r) => r,
        None => name.to_socket_addrs().map(|a| a.collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_broker_starts_only_this_executables_helpers_and_resolves() {
        start().unwrap();
        start().unwrap();
        // This test binary, asked for a test that does not exist: a helper
        // by name, and it ends at once.
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.arg("__no_such_test").stdout(std::process::Stdio::null());
        let status = spawn(c).unwrap().wait().unwrap();
        assert!(status.success());
        let e = spawn(Command::new("/bin/sh")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.arg("run");
        assert!(spawn(c).is_err(), "not a hidden helper");
        assert_eq!(
            resolve("127.0.0.1:80").unwrap(),
            vec!["127.0.0.1:80".parse().unwrap()]
        );
        assert!(!resolve("localhost:80").unwrap().is_empty());
        assert!(resolve("no port").is_err());
    }
}
