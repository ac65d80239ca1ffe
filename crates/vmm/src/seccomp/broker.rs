//! An unfiltered thread that does, on behalf of the confined control
//! thread, the two things the `control` filter forbids it: starting the
//! migration's sender process (`execve`, and a new program's loader maps
//! executable memory) and resolving a host name (glibc's NSS may load a
//! library: executable mappings again). It is started before the control
//! thread is confined, so it carries no filter; it takes only these two
//! requests, from a channel.
//!
//! Without a broker (a library user that never confines its thread) both
//! run on the caller's thread as before.

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

/// Start the broker (once per process; later calls do nothing). Call it
/// before the calling thread is confined.
pub fn start() -> io::Result<()> {
    if BROKER.get().is_some() {
        return Ok(());
    }
    let (tx, rx) = mpsc::channel::<Request>();
    std::thread::Builder::new()
        .name("hover-broker".into())
        .spawn(move || {
            for req in rx {
                match req {
                    Request::Spawn(mut cmd, answer) => {
                        let _ = answer.send(cmd.spawn());
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
    let sent = broker
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send(make(tx));
    Some(match sent {
        Ok(()) => rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("the broker thread is gone"))),
        Err(_) => Err(io::Error::other("the broker thread is gone")),
    })
}

/// Start `cmd` (through the broker if there is one).
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
    fn the_broker_spawns_and_resolves() {
        start().unwrap();
        start().unwrap();
        let mut c = Command::new("true");
        c.stdout(std::process::Stdio::null());
        let status = spawn(c).unwrap().wait().unwrap();
        assert!(status.success());
        assert!(spawn(Command::new("/nonexistent/program")).is_err());
        assert_eq!(
            resolve("127.0.0.1:80").unwrap(),
            vec!["127.0.0.1:80".parse().unwrap()]
        );
        assert!(!resolve("localhost:80").unwrap().is_empty());
        assert!(resolve("no port").is_err());
    }
}
