//! The snapshot format's version, apart from the file code and its errors
//! (both use it).

/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 4;
