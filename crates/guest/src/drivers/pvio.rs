//! Client of the paravirtual I/O device (`hover_abi::pvio`): one ring in the
//! image (never paged out), one request in flight at a time.

use core::cell::UnsafeCell;
use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};
use core::sync::atomic::{fence, Ordering};

use hover_abi::control::{op, status, ControlRequest};
use hover_abi::pvio::{
    io_op, io_status, IoRequest, IoRingHeader, COMPLETION_VECTOR, DOORBELL_PORT,
};

use crate::arch::percpu;
use crate::drivers::control;
use crate::kernel::{haltpoll, irq};

const ENTRIES: usize = 16;

#[repr(C, align(64))]
struct RingMem {
    header: IoRingHeader,
    requests: [IoRequest; ENTRIES],
}

struct Ring(UnsafeCell<RingMem>);
// SAFETY: one submitter at a time (the device is used by one task), and the
// monitor's writes are read volatile.
unsafe impl Sync for Ring {}

static RING: Ring = Ring(UnsafeCell::new(RingMem {
    header: IoRingHeader {
        submitted: 0,
        completed: 0,
    },
    requests: [IoRequest {
        op: 0,
        len: 0,
        offset: 0,
        buf: 0,
        vcpu: 0,
        status: 0,
        error: 0,
        reserved: 0,
    }; ENTRIES],
}));

/// Register the ring with the monitor; the control status.
pub fn setup() -> u32 {
    let mut req = ControlRequest {
        op: op::IO_SETUP,
        status: 0,
        arg0: RING.0.get() as u64,
        arg1: ENTRIES as u64,
    };
    control::send(&mut req)
}

/// Write `len` bytes at guest address `buf` to the device's file at
/// `offset`, and sleep until the write is durable: the request's status and errno.
pub fn write_sync(buf: u64, len: u32, offset: u64) -> (u32, i32) {
    let ring = RING.0.get();
    // SAFETY: the ring is ours; only this task submits; the monitor writes
    // `completed` and a request's status/error, which are read volatile.
    unsafe {
        let seq = read_volatile(addr_of!((*ring).header.submitted));
        let slot = addr_of_mut!((*ring).requests[seq as usize % ENTRIES]);
        let vcpu = percpu::this_cpu().index() as u32;
        write_volatile(
            slot,
            IoRequest {
                op: io_op::WRITE,
                len,
                offset,
                buf,
                vcpu,
                status: io_status::PENDING,
                error: 0,
                reserved: 0,
            },
        );
        // In `idle=haltpoll` mode this vCPU watches `completed` itself from
        // before the doorbell: the device may finish before the doorbell's
        // exit has even returned, and its interrupt is then not needed.
        let pc = percpu::this_cpu();
        haltpoll::watch(
            pc,
            addr_of!((*ring).header.completed),
            seq + 1,
            COMPLETION_VECTOR,
        );
        fence(Ordering::Release);
        write_volatile(addr_of_mut!((*ring).header.submitted), seq + 1);
        core::arch::asm!("out dx, eax", in("dx") DOORBELL_PORT, in("eax") 1u32, options(nostack, preserves_flags));
        while read_volatile(addr_of!((*ring).header.completed)) <= seq {
            irq::wait(COMPLETION_VECTOR);
        }
        haltpoll::unwatch(pc);
        fence(Ordering::Acquire);
        (
            read_volatile(addr_of!((*slot).status)),
            read_volatile(addr_of!((*slot).error)),
        )
    }
}

/// Whether `setup` succeeded.
pub fn setup_ok(st: u32) -> bool {
    st == status::OK
}
