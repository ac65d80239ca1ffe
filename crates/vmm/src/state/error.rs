//! Why a snapshot could not be written or read.

use std::io;
use std::path::PathBuf;

use super::version::FORMAT_VERSION;

/// Why a snapshot could not be written or read. Every variant names the
/// file; those about its content name the section and offset.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The path exists already.
    #[error("snapshot {}: already exists; give a new path (a snapshot never overwrites a file)", .0.display())]
    Exists(PathBuf),
    /// Reading or writing the file failed.
    #[error("snapshot {}: {what}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// Not a Hover snapshot.
    #[error("snapshot {}: not a Hover snapshot (no HOVERSNP magic at offset 0)", .0.display())]
    NotSnapshot(PathBuf),
    /// Written by another format version.
    #[error("snapshot {}: format version {found} at offset 8; this Hover reads version {FORMAT_VERSION}", .path.display())]
    Version {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u32,
    },
    /// Shorter than its header or sections say.
    #[error("snapshot {}: truncated: {what} at offset {offset} needs {need} bytes, the file has {len}", .path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
        /// The header or section.
        what: String,
        /// Where it starts.
        offset: u64,
        /// Bytes it needs.
        need: u64,
        /// The file's length.
        len: u64,
    },
    /// A CRC does not match.
    #[error("snapshot {}: {what} at offset {offset} is corrupted (CRC mismatch)", .path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The header, section or page.
        what: String,
        /// Where it starts.
        offset: u64,
    },
    /// A section is not what this build expects.
    #[error("snapshot {}: section {section} at offset {offset}: {reason}", .path.display())]
    BadSection {
        /// The file.
        path: PathBuf,
        /// The section's tag.
        section: String,
        /// Where it starts.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// The saved VM does not fit this host or this build.
    #[error("snapshot {}: section {section}: {reason}", .path.display())]
    Unfit {
        /// The file.
        path: PathBuf,
        /// The section whose content does not fit.
        section: &'static str,
        /// Why.
        reason: String,
    },
}
