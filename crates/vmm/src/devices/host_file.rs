//! Why a host file given for a guest's device (a disk image, the I/O
//! device's file) cannot serve it. The checks themselves stay with their
//! devices (`virtio::block::open_disk`, `pvio::fit_for_io` and
//! `pvio::check_io_path`); the caller adds which flag named the file.

/// A host file unfit for a guest's device.
#[derive(Debug, thiserror::Error)]
pub enum HostFileError {
    /// A FIFO, a directory, a socket...: a disk wants an image.
    #[error("not a regular file or a block device: give a raw disk image")]
    NotADiskImage,
    /// A FIFO, a directory, a socket...
    #[error("not a regular file or a block device")]
    NotStorage,
    /// A file of procfs or sysfs, whose "regular" files reach the
    /// monitor's own memory or the kernel's knobs.
    #[error("a file of procfs or sysfs, not storage")]
    Pseudo,
    /// A read-only file given for a writable disk.
    #[error("is a read-only file: add ,readonly to give it read-only")]
    ReadOnlyFile,
    /// Smaller than one sector.
    #[error("is {0} bytes: a disk holds at least one 512-byte sector")]
    TooSmall(u64),
    /// The path cannot be given to the OS.
    #[error("the path holds a NUL byte")]
    NulInPath,
    /// This user may not write it.
    #[error("cannot write there: {0}")]
    NotWritable(std::io::Error),
    /// It does not exist and cannot be made where it is to be.
    #[error("cannot be created: {0}")]
    CannotCreate(Box<HostFileError>),
    /// Its metadata cannot be read.
    #[error("cannot stat it: {0}")]
    Stat(std::io::Error),
    /// Its file system cannot be told.
    #[error("cannot statfs it: {0}")]
    Statfs(std::io::Error),
    /// Opening or sizing it failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}
