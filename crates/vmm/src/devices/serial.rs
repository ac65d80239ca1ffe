//! COM1, a 16550 UART (vm-superio), wired to the console target. Its interrupt
//! is an edge on GSI 4 of the in-kernel IOAPIC, raised with `KVM_IRQ_LINE`
//! from the thread that emulates the access (`irq_line`); with dynamic
//! boosting, the vCPU the IOAPIC routes it to is boosted right after.

use crate::sync::Locked;
use std::io::{self, Write};
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use vm_superio::serial::{NoEvents, SerialState};
use vm_superio::Serial;

use super::irq_line::IrqTrigger;
use super::state_error::StateError;
use crate::config::{ConsoleTarget, SharedBuffer};

/// Where console bytes go, and when the first one arrived.
pub struct ConsoleSink {
    out: Option<Box<dyn Write + Send>>,
    first_byte: Option<Instant>,
    bytes: u64,
    failed: bool,
}

struct BufferWriter(SharedBuffer);

impl Write for BufferWriter {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| io::Error::other("console buffer poisoned"))?
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ConsoleSink {
    /// A sink that drops every byte.
    pub fn discard() -> Self {
        ConsoleSink {
            out: None,
            first_byte: None,
            bytes: 0,
            failed: false,
        }
    }

    /// Open `target` (creating a file if asked).
    pub fn open(target: &ConsoleTarget) -> io::Result<Self> {
        let out: Option<Box<dyn Write + Send>> = match target {
            ConsoleTarget::Stdout | ConsoleTarget::Stdio => Some(Box::new(io::stdout())),
            ConsoleTarget::Stderr => Some(Box::new(io::stderr())),
            ConsoleTarget::Off => None,
            ConsoleTarget::File(p) => Some(Box::new(crate::host::files::open_output(
                p,
                crate::host::files::Existing::Truncate,
            )?)),
            ConsoleTarget::Buffer(b) => Some(Box::new(BufferWriter(b.clone()))),
        };
        Ok(ConsoleSink {
            out,
            first_byte: None,
            bytes: 0,
            failed: false,
        })
    }
}

impl Write for ConsoleSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.first_byte.is_none() && !buf.is_empty() {
            self.first_byte = Some(Instant::now());
        }
        self.bytes += buf.len() as u64;
        if let Some(out) = self.out.as_mut().filter(|_| !self.failed) {
            // A console that stops accepting output (a closed pipe, a full
            // disk) must not stop the guest: report once and drop the rest.
            let r = out.write_all(buf).and_then(|_| {
                if buf.contains(&b'\n') {
                    out.flush()
                } else {
                    Ok(())
                }
            });
            if let Err(e) = r {
                tracing::warn!("guest console output failed, dropping the rest: {e}");
                self.failed = true;
            }
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        if let Some(out) = self.out.as_mut().filter(|_| !self.failed) {
            if let Err(e) = out.flush() {
                tracing::warn!("guest console output failed, dropping the rest: {e}");
                self.failed = true;
            }
        }
        Ok(())
    }
}

/// The UART's registers and receive FIFO, as saved in a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UartState {
    /// Divisor latch, low byte.
    pub baud_divisor_low: u8,
    /// Divisor latch, high byte.
    pub baud_divisor_high: u8,
    /// Interrupt enable register.
    pub interrupt_enable: u8,
    /// Interrupt identification register.
    pub interrupt_identification: u8,
    /// Line control register.
    pub line_control: u8,
    /// Line status register.
    pub line_status: u8,
    /// Modem control register.
    pub modem_control: u8,
    /// Modem status register.
    pub modem_status: u8,
    /// Scratch register.
    pub scratch: u8,
    /// Bytes received and not yet read by the guest.
    pub in_buffer: Vec<u8>,
}

type Uart = Serial<IrqTrigger, NoEvents, ConsoleSink>;

fn uart_state(s: &UartState) -> SerialState {
    SerialState {
        baud_divisor_low: s.baud_divisor_low,
        baud_divisor_high: s.baud_divisor_high,
        interrupt_enable: s.interrupt_enable,
        interrupt_identification: s.interrupt_identification,
        line_control: s.line_control,
        line_status: s.line_status,
        modem_control: s.modem_control,
        modem_status: s.modem_status,
        scratch: s.scratch,
        in_buffer: s.in_buffer.clone(),
    }
}

/// COM1 with its console.
pub struct SerialConsole(Mutex<Uart>);

impl SerialConsole {
    /// A UART that raises `irq` and writes to `sink`.
    pub fn new(irq: IrqTrigger, sink: ConsoleSink) -> Self {
        SerialConsole(Mutex::new(Serial::new(irq, sink)))
    }

    /// Take up the saved state `s` (a restore, a migration's arrival);
    /// the interrupt line and console stay. A state vm-superio refuses
    /// leaves the UART as it was.
    pub fn restore(&self, s: &UartState) -> Result<(), StateError> {
        let mut uart = self.lock();
        let irq = uart
            .interrupt_evt()
            .try_clone()
            .map_err(|source| StateError::Host {
                device: "serial port".into(),
                what: "its interrupt line",
                source,
            })?;
        let placeholder = ConsoleSink::discard();
        let restored = Serial::from_state(&uart_state(s), irq, NoEvents, placeholder)
            .map_err(|e| StateError::decode("serial port", format!("{e:?}")))?;
        let old = std::mem::replace(&mut *uart, restored);
        *uart.writer_mut() = old.into_writer();
        Ok(())
    }

    /// The UART's state.
    pub fn state(&self) -> UartState {
        let s = self.lock().state();
        UartState {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Uart> {
        // A vCPU thread that panicked while holding the lock leaves the UART
        // state intact (each access is one register), so keep using it.
        self.0.locked()
    }

    /// A guest write to register `offset`.
    pub fn write(&self, offset: u8, value: u8) {
        if let Err(e) = self.lock().write(offset, value) {
            tracing::warn!("serial write to register {offset} failed: {e:?}");
        }
    }

    /// A guest read of register `offset`.
    pub fn read(&self, offset: u8) -> u8 {
        self.lock().read(offset)
    }

    /// Put `bytes` in the receive FIFO, as many as it has room for
    /// (raising the receive interrupt if the guest enabled it); how many.
    pub fn enqueue(&self, bytes: &[u8]) -> usize {
        let mut uart = self.lock();
        let room = uart.fifo_capacity().min(bytes.len());
        if room == 0 {
            return 0;
        }
        match uart.enqueue_raw_bytes(&bytes[..room]) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!("console input not delivered: {e}");
                0
            }
        }
    }

    /// When the guest wrote its first console byte.
    pub fn first_byte_at(&self) -> Option<Instant> {
        self.lock().writer().first_byte
    }

    /// Bytes the guest has written to the console.
    pub fn bytes_written(&self) -> u64 {
        self.lock().writer().bytes
    }

    /// Flush the console target.
    pub fn flush(&self) {
        let _ = self.lock().writer_mut().flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    #[test]
    fn bytes_reach_the_buffer_and_are_timed() {
        let buf: SharedBuffer = Arc::new(Mutex::new(Vec::new()));
        let sink = ConsoleSink::open(&ConsoleTarget::Buffer(buf.clone())).unwrap();
        let s = SerialConsole::new(IrqTrigger::counted(Default::default()), sink);
        assert!(s.first_byte_at().is_none());
        for b in b"hi\n" {
            s.write(0, *b);
        }
        assert_eq!(&buf.lock().unwrap()[..], b"hi\n");
        assert!(s.first_byte_at().is_some());
        assert_eq!(s.bytes_written(), 3);
    }

    #[test]
    fn each_byte_sent_with_its_interrupt_enabled_raises_the_line_once() {
        let raised = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let s = SerialConsole::new(IrqTrigger::counted(raised.clone()), ConsoleSink::discard());
        s.write(0, b'a');
        assert_eq!(raised.load(Ordering::Relaxed), 0, "interrupts are off");
        s.write(1, 0x02); // IER: transmitter empty
        for (i, b) in b"xyz".iter().enumerate() {
            s.write(0, *b);
            assert_eq!(raised.load(Ordering::Relaxed), i as u64 + 1);
            // The driver's acknowledgement: reading IIR.
            assert_eq!(s.read(2) & 0x0f, 0x02, "transmitter empty");
        }
    }

    #[test]
    fn state_round_trips_and_the_console_stays() {
        let buf: SharedBuffer = Arc::new(Mutex::new(Vec::new()));
        let sink = ConsoleSink::open(&ConsoleTarget::Buffer(buf.clone())).unwrap();
        let s = SerialConsole::new(
            IrqTrigger::counted(Default::default()),
            ConsoleSink::discard(),
        );
        s.write(7, 0x5a); // scratch
        s.write(3, 0x80); // DLAB
        s.write(0, 0x0c); // divisor low
        s.write(3, 0x03); // 8N1, DLAB off
        let st = s.state();
        let back = SerialConsole::new(IrqTrigger::counted(Default::default()), sink);
        back.write(0, b'a');
        back.restore(&st).unwrap();
        assert_eq!(back.state(), st);
        assert_eq!(st.scratch, 0x5a);
        back.write(0, b'b');
        assert_eq!(
            &buf.lock().unwrap()[..],
            b"ab",
            "the console outlives a restore"
        );
        assert_eq!(back.bytes_written(), 2);
        let bad = UartState {
            in_buffer: vec![0; 1 << 16],
            ..st.clone()
        };
        assert!(back.restore(&bad).is_err());
        assert_eq!(
            back.state(),
            st,
            "a refused state leaves the UART as it was"
        );
    }
}
