//! `evict-report`: a test that the monitor serves its own reads of guest
//! memory the pager has evicted. The workload writes a control request and
//! a report batch into pageable memory, touches `size` more bytes (more than
//! the memory budget, so with FIFO eviction the batch's page goes to the
//! page store), then hands the request to the monitor, which must fault the
//! page back in to read it.

use hover_abi::control::{op, status, ControlRequest, Report};
use hover_abi::exit_code;

use super::Context;
use crate::kernel::api::{frames, println, send_control};

/// The value the test expects back.
const MARK: u64 = 0x0123_4567_89ab_cdef;
const PAGE: u64 = 4096;

pub fn run(ctx: &Context) -> u32 {
    let size = ctx.number("size").div_ceil(PAGE) * PAGE;
    let (Some(batch), Some(filler)) = (frames::alloc(PAGE, PAGE), frames::alloc(size, PAGE)) else {
        println!("evict-report: not enough guest memory");
        return exit_code::WORKLOAD_FAILED;
    };
    let reports = (batch + 64) as *mut Report;
    // SAFETY: `batch` is a page allocated for this workload, identity-mapped;
    // the request and two reports fit in it.
    unsafe {
        reports.write(Report::u64("evict.mark", MARK));
        reports.add(1).write(Report::u64("evict.batch_gpa", batch));
        (batch as *mut ControlRequest).write(ControlRequest {
            op: op::REPORT,
            status: 0,
            arg0: reports as u64,
            arg1: 2,
        });
    }
    let mut a = filler;
    while a < filler + size {
        // SAFETY: inside the filler allocation.
        unsafe { (a as *mut u8).write_volatile(1) };
        a += PAGE;
    }
    // SAFETY: the request written above, brought back in on access.
    let st = send_control(unsafe { &mut *(batch as *mut ControlRequest) });
    println!(
        "evict-report: batch at {:#x} sent after touching {} MiB, status {}",
        batch,
        size >> 20,
        st
    );
    if st == status::OK {
        exit_code::OK
    } else {
        exit_code::WORKLOAD_FAILED
    }
}
