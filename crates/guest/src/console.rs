//! The serial console (16550 at 0x3f8): formatted lines, one vCPU at a time.
//!
//! Every byte is one port write and one exit (~31 us from CPL3), so callers
//! print short lines. A line is built in a buffer first and written under a
//! lock so that lines from different vCPUs never interleave.

use core::arch::asm;
use core::fmt::{self, Write};
use core::sync::atomic::{AtomicBool, Ordering};

use crate::clock;

const COM1: u16 = 0x3f8;
const LINE_MAX: usize = 256;

static LOCK: AtomicBool = AtomicBool::new(false);

fn outb(port: u16, value: u8) {
    // SAFETY: the TSS I/O bitmap grants CPL3 access to the console ports.
    unsafe {
        asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags))
    };
}

/// A line being assembled; bytes past [`LINE_MAX`] are dropped.
pub struct Line {
    buf: [u8; LINE_MAX],
    len: usize,
}

impl Line {
    /// An empty line.
    pub const fn new() -> Self {
        Line {
            buf: [0; LINE_MAX],
            len: 0,
        }
    }
}

impl Write for Line {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let n = s.len().min(LINE_MAX - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Write `args` and a newline to the console.
pub fn print_line(args: fmt::Arguments) {
    let mut line = Line::new();
    // Line never fails; truncation is intended.
    let _ = line.write_fmt(args);
    let _ = line.write_str("\n");
    // A CPU that died holding the lock must not silence the others forever:
    // after 100 ms of waiting, print anyway.
    let deadline = clock::deadline_after_us(100_000);
    while LOCK.swap(true, Ordering::Acquire) {
        if clock::now() > deadline {
            break;
        }
        core::hint::spin_loop();
    }
    for &b in &line.buf[..line.len] {
        outb(COM1, b);
    }
    LOCK.store(false, Ordering::Release);
}

/// Print a formatted line on the serial console.
#[macro_export]
macro_rules! println {
    ($($arg:tt)*) => { $crate::console::print_line(format_args!($($arg)*)) };
}
