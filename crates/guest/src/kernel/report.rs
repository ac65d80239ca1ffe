//! Collecting a workload's results and sending them in one control request
//! (each request is an exit, ~31 us here).

use core::fmt::{self, Write};

use crate::kernel::fmtbuf::FmtBuf;

use hover_abi::control::{Report, REPORT_KEY_MAX};

use crate::drivers::control;
use crate::println;

/// Enough for the largest workload report (spin with 60 tasks: 183 records);
/// a batch lives on its task's 64 KiB stack (48 bytes a record).
const CAPACITY: usize = 256;

/// A batch of reports.
pub struct Reports {
    items: [Report; CAPACITY],
    len: usize,
}

impl Reports {
    /// An empty batch.
    pub const fn new() -> Self {
        Reports {
            items: [Report {
                key: [0; 32],
                kind: 0,
                reserved: 0,
                value: 0,
            }; CAPACITY],
            len: 0,
        }
    }

    fn push(&mut self, key: fmt::Arguments, make: impl Fn(&str) -> Report) {
        if self.len == CAPACITY {
            println!("guest: report batch full, dropping {}", key);
            return;
        }
        let mut k = FmtBuf::<REPORT_KEY_MAX>::new();
        let _ = k.write_fmt(key);
        self.items[self.len] = make(k.as_str());
        self.len += 1;
    }

    /// Add an unsigned value.
    pub fn u64(&mut self, key: fmt::Arguments, value: u64) {
        self.push(key, |k| Report::u64(k, value));
    }

    /// Send the batch to the monitor.
    pub fn send(&self) {
        let status = control::report(&self.items[..self.len]);
        if status != hover_abi::control::status::OK {
            println!(
                "guest: the monitor refused a report batch (status {})",
                status
            );
        }
    }
}
