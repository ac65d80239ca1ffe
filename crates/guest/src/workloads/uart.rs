//! `uart`: the serial port's interrupts for a task on another vCPU. The
//! main task (vCPU 0) routes COM1's line (GSI 4) through the IOAPIC to vCPU
//! `target`, puts the UART in loopback (what it sends comes back as
//! received data, so nothing reaches the console), enables the
//! received-data interrupt and sends `count` bytes one at a time. A task
//! pinned on `target` waits for each interrupt, reads the byte and checks
//! it. Latency: from the send to that task running. A monitor that boosts
//! on the interrupts it raises boosts `target` for each (`sched/boost`).

use core::sync::atomic::{AtomicU64, Ordering};

use hover_abi::exit_code;
use hover_abi::vectors::DEVICE_BASE;

use super::{Context, Latency};
use crate::kernel::api::{
    deadline_after_us, exit, ioapic, irq_count, join, now, println, sleep_until, spawn, uart_read,
    uart_write, wait_irq, Event, Placement, Reports, SpinLock,
};

/// COM1's line on the IOAPIC.
const GSI: u32 = 4;
/// The device vector the line is routed to.
const VECTOR: u8 = DEVICE_BASE + 14;
const IER: u16 = 1;
const IIR: u16 = 2;
const MCR: u16 = 4;
const LSR: u16 = 5;
const IER_RECEIVED: u8 = 1;
const MCR_LOOP: u8 = 1 << 4;
const LSR_DATA_READY: u8 = 1;
/// How long a byte may take to come back through an interrupt.
const BYTE_TIMEOUT_US: u64 = 1_000_000;

static COUNT: AtomicU64 = AtomicU64::new(0);
static TARGET: AtomicU64 = AtomicU64::new(0);
/// The receiver has handled the byte in flight.
static ACK: Event = Event::new();
/// The receiver runs (its vCPU takes interrupts).
static READY: Event = Event::new();
/// TSC when the byte now in flight was sent.
static SENT_AT: AtomicU64 = AtomicU64::new(0);
/// Bytes received with the value sent, and with another.
static RECEIVED: AtomicU64 = AtomicU64::new(0);
static WRONG: AtomicU64 = AtomicU64::new(0);
/// The receiver's latencies, handed over as it ends.
static LATENCY: SpinLock<Latency> = SpinLock::new(Latency::new());

fn byte(i: u64) -> u8 {
    (i % 251) as u8
}

fn receiver(_: usize) {
    READY.signal();
    let mut lat = Latency::new();
    for i in 0..COUNT.load(Ordering::Relaxed) {
        wait_irq(VECTOR);
        let woke = now();
        lat.add(woke.saturating_sub(SENT_AT.load(Ordering::SeqCst)));
        // Reading IIR acknowledges; the data register empties the FIFO.
        let _ = uart_read(IIR);
        while uart_read(LSR) & LSR_DATA_READY != 0 {
            if uart_read(0) == byte(i) {
                RECEIVED.fetch_add(1, Ordering::SeqCst);
            } else {
                WRONG.fetch_add(1, Ordering::SeqCst);
            }
        }
        ACK.signal();
    }
    *LATENCY.lock() = lat;
}

/// Ends the run if a byte does not come back within [`BYTE_TIMEOUT_US`]
/// (a misrouted line would leave both tasks waiting forever).
fn watchdog(mcr: usize) {
    let count = COUNT.load(Ordering::Relaxed);
    let mut seen = u64::MAX;
    loop {
        sleep_until(deadline_after_us(BYTE_TIMEOUT_US));
        let done = RECEIVED.load(Ordering::SeqCst) + WRONG.load(Ordering::SeqCst);
        if done >= count {
            return;
        }
        if done == seen {
            restore(mcr as u8);
            let target = TARGET.load(Ordering::Relaxed) as usize;
            println!(
                "uart: byte {} did not come back through an interrupt on vCPU {} within {} ms (COM1's line, GSI {}, routed to vector {:#x}); {} interrupts arrived",
                done,
                target,
                BYTE_TIMEOUT_US / 1000,
                GSI,
                VECTOR,
                irq_count(target, VECTOR)
            );
            exit(exit_code::WORKLOAD_FAILED);
        }
        seen = done;
    }
}

/// Undo the set-up: no interrupts, no loopback, the line masked.
fn restore(mcr: u8) {
    uart_write(IER, 0);
    uart_write(MCR, mcr);
    ioapic::mask(GSI);
}

pub fn run(ctx: &Context) -> u32 {
    let count = ctx.number("count");
    let target = ctx.number("target").min(ctx.vcpus() as u64 - 1) as usize;
    COUNT.store(count, Ordering::Relaxed);
    TARGET.store(target as u64, Ordering::Relaxed);
    let Ok(task) = spawn(receiver, 0, Placement::Pinned(target)) else {
        println!("uart: cannot start the receiving task");
        return exit_code::WORKLOAD_FAILED;
    };
    // An interrupt for a vCPU whose local APIC is not set up yet is lost
    // (edge-triggered), and the UART raises no other while its first one
    // is pending: route the line only once the receiver runs there.
    READY.wait();
    let mcr = uart_read(MCR);
    ioapic::route(GSI, VECTOR, target as u32);
    uart_write(MCR, mcr | MCR_LOOP);
    // Drain what an earlier run may have left, then take interrupts.
    while uart_read(LSR) & LSR_DATA_READY != 0 {
        let _ = uart_read(0);
    }
    uart_write(IER, IER_RECEIVED);
    let Ok(_) = spawn(watchdog, mcr as usize, Placement::Pinned(0)) else {
        restore(mcr);
        println!("uart: cannot start the watchdog task");
        return exit_code::WORKLOAD_FAILED;
    };
    for i in 0..count {
        SENT_AT.store(now(), Ordering::SeqCst);
        uart_write(0, byte(i));
        ACK.wait();
    }
    join(task);
    restore(mcr);
    let received = RECEIVED.load(Ordering::SeqCst);
    let wrong = WRONG.load(Ordering::SeqCst);
    let mut r = Reports::new();
    r.u64(format_args!("uart.target"), target as u64);
    r.u64(format_args!("uart.interrupts"), irq_count(target, VECTOR));
    r.u64(format_args!("uart.received"), received);
    r.u64(format_args!("uart.wrong"), wrong);
    let avg_ns = {
        let lat = LATENCY.lock();
        lat.report(&mut r, "uart", true);
        lat.avg_ns()
    };
    r.send();
    println!(
        "uart: {} bytes back through interrupts on vCPU {}, {} wrong, average latency {} ns",
        received, target, wrong, avg_ns
    );
    if received != count || wrong != 0 {
        return exit_code::WORKLOAD_FAILED;
    }
    exit_code::OK
}
