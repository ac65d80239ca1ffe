//! The serial console (16550 at 0x3f8): formatted lines, one vCPU at a time.
//!
//! Every byte is one port write and one exit (~31 us from CPL3), so callers
//! print short lines. A line is built in a buffer first and written under a
//! lock so that lines from different vCPUs never interleave.

use core::arch::asm;
use core::fmt::{self, Write};
use core::sync::atomic::{AtomicBool, Ordering};

use crate::kernel::clock;
use crate::kernel::fmtbuf::FmtBuf;

const COM1: u16 = 0x3f8;
const LINE_MAX: usize = 256;

static LOCK: AtomicBool = AtomicBool::new(false);

fn outb(port: u16, value: u8) {
    // SAFETY: the TSS I/O bitmap grants CPL3 access to the console ports.
    unsafe {
        asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags))
    };
}

fn inb(port: u16) -> u8 {
    let value: u8;
    // SAFETY: as for outb.
    unsafe {
        asm!("in al, dx", in("dx") port, out("al") value, options(nomem, nostack, preserves_flags))
    };
    value
}

/// Write `value` to register `offset` (0-7) of the console's UART.
pub fn uart_write(offset: u16, value: u8) {
    outb(COM1 + (offset & 7), value);
}

/// Read register `offset` (0-7) of the console's UART.
pub fn uart_read(offset: u16) -> u8 {
    inb(COM1 + (offset & 7))
}

/// Write `args` and a newline to the console.
pub fn print_line(args: fmt::Arguments) {
    let mut line = FmtBuf::<LINE_MAX>::new();
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
    for &b in line.bytes() {
        outb(COM1, b);
    }
    LOCK.store(false, Ordering::Release);
}

/// Print a formatted line on the serial console.
#[macro_export]
macro_rules! println {
    ($($arg:tt)*) => { $crate::drivers::console::print_line(format_args!($($arg)*)) };
}
