//! The paravirtual I/O device: synchronous writes to a host file, submitted
//! through a ring in guest memory and a doorbell, completed by an interrupt.
//!
//! Setup (once): the guest lays out an [`IoRingHeader`] followed by
//! `entries` [`IoRequest`]s in its memory and sends the control request
//! `op::IO_SETUP` (`arg0` = ring gpa, `arg1` = entries, a power of two up to
//! [`MAX_ENTRIES`]).
//! Submitting: fill `requests[submitted % entries]` (status PENDING), then
//! increment `submitted`, then write any value to [`DOORBELL_PORT`]. The
//! doorbell is an ioeventfd: KVM wakes the monitor's I/O thread without an
//! exit to the monitor. The I/O thread performs each write on its file
//! (opened O_DSYNC: each write is durable before it completes), writes the
//! request's `status` (and `error`), increments `completed`, and raises
//! [`COMPLETION_VECTOR`] on the request's `vcpu` through an irqfd.

use crate::vectors;

/// I/O port of the doorbell (32-bit write; the value is ignored).
pub const DOORBELL_PORT: u16 = 0x610;
/// Interrupt raised on completion, on the vCPU named in the request.
pub const COMPLETION_VECTOR: u8 = vectors::DEVICE_BASE + 1;
/// Most ring entries.
pub const MAX_ENTRIES: u32 = 256;
/// Longest single request.
pub const MAX_LEN: u32 = 1 << 20;
/// Largest offset + length a request may reach in the file (16 GiB).
pub const MAX_FILE_BYTES: u64 = 16 << 30;

/// Request operations.
pub mod io_op {
    /// Write `len` bytes from guest `buf` to the file at `offset`.
    pub const WRITE: u32 = 1;
}

/// Request status, written by the monitor.
pub mod io_status {
    /// Not done yet.
    pub const PENDING: u32 = 0;
    /// Done.
    pub const OK: u32 = 1;
    /// Malformed: unknown op, length over the limit, buffer outside RAM, bad vCPU.
    pub const BAD_REQUEST: u32 = 2;
    /// The host write failed; `error` holds the errno.
    pub const IO_ERROR: u32 = 3;
}

/// The ring's header; `entries` requests follow it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoRingHeader {
    /// Requests submitted (written by the guest).
    pub submitted: u64,
    /// Requests completed (written by the monitor).
    pub completed: u64,
}

/// One request.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoRequest {
    /// One of [`io_op`].
    pub op: u32,
    /// Bytes to write.
    pub len: u32,
    /// File offset.
    pub offset: u64,
    /// Guest-physical address of the data.
    pub buf: u64,
    /// vCPU to interrupt on completion.
    pub vcpu: u32,
    /// One of [`io_status`].
    pub status: u32,
    /// errno with `io_status::IO_ERROR`.
    pub error: i32,
    /// Zero.
    pub reserved: u32,
}

/// Where [`IoRingHeader`]'s fields sit, from the type.
pub mod header_offset {
    use super::IoRingHeader;
    use core::mem::offset_of;
    /// [`IoRingHeader::submitted`].
    pub const SUBMITTED: u64 = offset_of!(IoRingHeader, submitted) as u64;
    /// [`IoRingHeader::completed`].
    pub const COMPLETED: u64 = offset_of!(IoRingHeader, completed) as u64;
}

/// Where [`IoRequest`]'s fields sit, from the type.
pub mod request_offset {
    use super::IoRequest;
    use core::mem::offset_of;
    /// [`IoRequest::op`].
    pub const OP: usize = offset_of!(IoRequest, op);
    /// [`IoRequest::len`].
    pub const LEN: usize = offset_of!(IoRequest, len);
    /// [`IoRequest::offset`].
    pub const OFFSET: usize = offset_of!(IoRequest, offset);
    /// [`IoRequest::buf`].
    pub const BUF: usize = offset_of!(IoRequest, buf);
    /// [`IoRequest::vcpu`].
    pub const VCPU: usize = offset_of!(IoRequest, vcpu);
    /// [`IoRequest::status`].
    pub const STATUS: usize = offset_of!(IoRequest, status);
    /// [`IoRequest::error`].
    pub const ERROR: usize = offset_of!(IoRequest, error);
}

/// Bytes of [`IoRingHeader`]: the first request follows.
pub const HEADER_SIZE: u64 = core::mem::size_of::<IoRingHeader>() as u64;
/// Bytes of one [`IoRequest`].
pub const REQUEST_SIZE: u64 = core::mem::size_of::<IoRequest>() as u64;

const _: () = assert!(core::mem::size_of::<IoRingHeader>() == 16);
const _: () = assert!(core::mem::size_of::<IoRequest>() == 40);

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout docs/ABI.md publishes: derived offsets, pinned here.
    #[test]
    fn layouts_are_the_published_ones() {
        use header_offset as h;
        assert_eq!([h::SUBMITTED, h::COMPLETED, HEADER_SIZE], [0, 8, 16]);
        use request_offset as q;
        assert_eq!(
            [
                q::OP,
                q::LEN,
                q::OFFSET,
                q::BUF,
                q::VCPU,
                q::STATUS,
                q::ERROR
            ],
            [0, 4, 8, 16, 24, 28, 32]
        );
        assert_eq!(REQUEST_SIZE, 40);
    }
}
