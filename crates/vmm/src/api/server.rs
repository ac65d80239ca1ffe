//! The API's Unix socket: created 0600 under a private name beside its
//! path and linked in place when published (a client that finds it can
//! connect at once, and a VM publishes it only once its vCPUs run); a
//! stale socket of a killed VM is replaced, anything else refused; removed
//! when the server stops, if the path still names it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::http::{self, HttpServer};
use super::{ApiError, LiveSources, Routes};
use crate::host::socket::bind_private;
use crate::vm::Controller;

/// Remove `path` if it is a socket nobody listens on (left by a VM that was
/// killed): whether it was. Anything else there (a live socket, a file) is
/// left alone.
fn remove_if_stale(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    let is_socket = path
        .symlink_metadata()
        .is_ok_and(|m| m.file_type().is_socket());
    if !is_socket {
        return false;
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            let removed = std::fs::remove_file(path).is_ok();
            if removed {
                tracing::warn!(
                    "--api-socket {}: removed a stale socket (nothing listened there)",
                    path.display()
                );
            }
            removed
        }
        _ => false,
    }
}

/// Remove staging names beside `path` left by a VMM that was killed between
/// binding and linking (`.hover-api-PID-N` of a PID no longer running).
fn remove_stale_staging(path: &Path) {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(".hover-api-")) else {
            continue;
        };
        let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
        let gone = pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists());
        if gone && std::fs::remove_file(e.path()).is_ok() {
            tracing::warn!(
                "removed {}, left by a VMM that was killed while starting its API",
                e.path().display()
            );
        }
    }
}

/// A name beside `path` for binding before the socket is linked in place,
/// if a Unix socket address has room for it.
fn staging_path(path: &Path) -> Option<PathBuf> {
    // sun_path is 108 bytes with its terminating NUL.
    const SUN_PATH_MAX: usize = 107;
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!(".hover-api-{}-{n}", std::process::id());
    let staged = path.parent().unwrap_or(Path::new("")).join(name);
    (staged.as_os_str().len() <= SUN_PATH_MAX).then_some(staged)
}

/// The listening socket and the server answering on it.
pub struct ApiServer {
    path: PathBuf,
    /// The socket file's (device, inode): removed at the end only if the
    /// path still names it (a user may have put something else there).
    inode: Option<(u64, u64)>,
    server: Option<HttpServer>,
    /// The private name it listens under until [`ApiServer::publish`].
    staged: Option<PathBuf>,
}

impl ApiServer {
    /// Listen at `path` and serve `sources` and `controller` until stopped.
    pub fn start(
        path: &Path,
        sources: LiveSources,
        controller: Controller,
    ) -> Result<ApiServer, ApiError> {
        let mut api = ApiServer::start_unpublished(path, sources, controller)?;
        api.publish()?;
        Ok(api)
    }

    /// As [`ApiServer::start`], published later ([`ApiServer::publish`]).
    pub fn start_unpublished(
        path: &Path,
        sources: LiveSources,
        controller: Controller,
    ) -> Result<ApiServer, ApiError> {
        let routes = Arc::new(Routes::new(sources, controller));
        ApiServer::listen_unpublished(path, Arc::new(move |r: &http::Request| routes.handle(r)))
    }

    /// Listen at `path` (created 0600; a stale socket there is replaced,
    /// anything else refused) and answer each request with `handler` on
    /// threads under the API's seccomp filter, until stopped.
    pub fn listen(path: &Path, handler: http::Handler) -> Result<ApiServer, ApiError> {
        let mut api = ApiServer::listen_unpublished(path, handler)?;
        api.publish()?;
        Ok(api)
    }

    /// As [`ApiServer::listen`], but the socket is found under `path` only
    /// once [`ApiServer::publish`]ed (it listens under a private name
    /// beside it meanwhile, when the name fits a socket address).
    pub fn listen_unpublished(path: &Path, handler: http::Handler) -> Result<ApiServer, ApiError> {
        if path.symlink_metadata().is_ok() && !remove_if_stale(path) {
            return Err(ApiError::Exists(path.into()));
        }
        let bind = |source| ApiError::Bind {
            path: path.into(),
            source,
        };
        // Bind and listen under a private name, then link the socket to
        // its real name: a client that sees `path` can connect at once
        // (binding in place leaves a moment when the file exists but nothing
        // listens, and a quick client gets ECONNREFUSED), and link() refuses
        // to replace anything that appeared there meanwhile.
        remove_stale_staging(path);
        let staging = staging_path(path);
        // Only the owner may steer the VM: the socket is 0600 from the
        // moment it exists (no window before a chmod).
        let (listener, bound_at) = match staging.as_deref().map(|s| (bind_private(s), s)) {
            Some((Ok(l), s)) => (l, s),
            // No room for a private name (socket paths are short): bind in place.
            _ => (bind_private(path).map_err(bind)?, path),
        };
        let unbind = || {
            let _ = std::fs::remove_file(bound_at);
        };
        // The server's threads (accepting, one per connection: outside
        // input) are started from a thread under the API's seccomp filter,
        // and inherit it.
        let (made_tx, made) = std::sync::mpsc::channel();
        let spawned = crate::seccomp::spawn(crate::seccomp::Kind::Api, "api".into(), move || {
            let _ = made_tx.send(HttpServer::start(
                listener,
                http::Limits::default(),
                handler,
            ));
        });
        let made = match spawned {
            Ok(t) => {
                let made = made
                    .recv()
                    .unwrap_or_else(|_| Err(std::io::Error::other("the API thread ended")));
                let _ = t.join();
                made
            }
            Err(e) => Err(std::io::Error::other(e.to_string())),
        };
        let server = match made {
            Ok(s) => s,
            Err(e) => {
                unbind();
                return Err(bind(e));
            }
        };
        let mut api = ApiServer {
            path: path.into(),
            inode: None,
            server: Some(server),
            staged: (bound_at != path).then(|| bound_at.to_path_buf()),
        };
        if api.staged.is_none() {
            api.note_inode();
        }
        Ok(api)
    }

    /// Link the socket under its real name, if it is not there yet: from
    /// here clients find it. (A VM publishes its socket once its vCPUs run,
    /// so that a client never finds a VM that cannot be paused yet.)
    pub fn publish(&mut self) -> Result<(), ApiError> {
        let Some(staged) = self.staged.take() else {
            return Ok(());
        };
        let linked = std::fs::hard_link(&staged, &self.path);
        let _ = std::fs::remove_file(&staged);
        match linked {
            Ok(()) => {
                self.note_inode();
                Ok(())
            }
            Err(e) => {
                if let Some(mut s) = self.server.take() {
                    s.stop(Duration::ZERO);
                }
                Err(match e.kind() {
                    std::io::ErrorKind::AlreadyExists => ApiError::Exists(self.path.clone()),
                    _ => ApiError::Bind {
                        path: self.path.clone(),
                        source: e,
                    },
                })
            }
        }
    }

    fn note_inode(&mut self) {
        use std::os::unix::fs::MetadataExt;
        self.inode = std::fs::metadata(&self.path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
    }

    /// Stop serving and remove the socket. Answers being written go out
    /// first (bounded: a slow client must not hold the VM's exit).
    pub fn stop(&mut self) {
        if let Some(staged) = self.staged.take() {
            let _ = std::fs::remove_file(staged);
        }
        if let Some(mut s) = self.server.take() {
            s.stop(Duration::from_secs(2));
            use std::os::unix::fs::MetadataExt;
            let still_ours = std::fs::symlink_metadata(&self.path)
                .is_ok_and(|m| Some((m.dev(), m.ino())) == self.inode);
            if still_ours {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A VM's API on a socket of its own (`--api-socket`): bound unpublished
/// as the run starts, published once the vCPUs run, removed at the end.
pub struct SocketApi {
    path: PathBuf,
    server: Option<ApiServer>,
}

impl SocketApi {
    /// Serve the VM's API at `path` while it runs.
    pub fn new(path: &Path) -> Self {
        SocketApi {
            path: path.into(),
            server: None,
        }
    }
}

impl crate::vm::ApiHost for SocketApi {
    fn start(&mut self, sources: LiveSources, controller: Controller) -> Result<(), crate::Error> {
        self.server = Some(ApiServer::start_unpublished(
            &self.path, sources, controller,
        )?);
        Ok(())
    }

    fn publish(&mut self) -> Result<(), crate::Error> {
        match self.server.as_mut() {
            Some(server) => Ok(server.publish()?),
            None => Ok(()),
        }
    }

    fn stop(&mut self) {
        if let Some(mut server) = self.server.take() {
            server.stop();
        }
    }
}
