//! The snapshot format's version, apart from the file code and its errors
//! (both use it).

/// The format version this build writes and reads.
/// 5 (2026-11-27): a VM's disks, network cards (with ids) and entropy
/// device in its configuration, the PIT, and each virtio transport.
/// 6 (2026-11-28): the balloon in the configuration, a virtio device's
/// own state beside its transport's.
pub const FORMAT_VERSION: u32 = 6;
