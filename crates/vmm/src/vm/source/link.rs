//! The source's side of a migration connection, shared by pre-copy
//! (source/mod.rs), its handshake and post-copy: the stream's reader and
//! writer, its timeouts, and how a failure is told (this host's, or the
//! link's).

use std::time::Duration;

use crate::migration::transport::Conn;
use crate::migration::wire::FrameReader;
use crate::migration::MigrationError;

/// How long connecting may take.
pub(in crate::vm) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a read or write may stall before the peer counts as gone.
pub(in crate::vm) const IO_TIMEOUT: Duration = Duration::from_secs(30);
pub(in crate::vm) use crate::migration::page_sender::Writer;
pub(in crate::vm) type Reader = FrameReader<Conn>;

pub(in crate::vm) fn io(what: &'static str) -> impl Fn(std::io::Error) -> MigrationError {
    move |e| MigrationError::host(what, e)
}

/// A failure of the connection itself (the peer died, stalled or closed):
/// the destination's fault, not this host's ([`MigrationError::link`]).
pub(in crate::vm) fn link(what: &'static str) -> impl Fn(std::io::Error) -> MigrationError {
    move |e| MigrationError::link(what, e)
}
