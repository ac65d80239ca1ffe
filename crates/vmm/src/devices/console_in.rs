//! The interactive console (`--console stdio`): what is typed on the
//! VMM's standard input reaches the guest's COM1, as a terminal on a
//! serial line would. On a terminal, the terminal is put in raw mode (keys
//! go to the guest as typed, Ctrl-C included) and restored when the VM
//! ends. `Ctrl-A x` ends the VM (`ended: shutdown`), `Ctrl-A Ctrl-A` sends
//! one Ctrl-A, as in QEMU's `-serial mon:stdio`.
//!
//! Input the guest does not take (its UART's 64-byte FIFO is full, or no
//! driver reads it) waits here, up to [`PENDING_MAX`] bytes; beyond that it
//! is dropped with one warning: standard input is always read, so the
//! escape works whatever the guest does.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::thread::JoinHandle;

use vmm_sys_util::eventfd::EventFd;

use super::gate::Gate;
use super::Devices;

/// The escape key: Ctrl-A.
pub const ESCAPE: u8 = 0x01;
/// After the escape, the key that ends the VM.
pub const QUIT: u8 = b'x';
/// Input held for the guest at most.
pub const PENDING_MAX: usize = 64 * 1024;

/// What the escape parser makes of the keys typed.
#[derive(Debug, Default)]
pub struct EscapeParser {
    escaped: bool,
}

/// The parser's verdict on a chunk of input.
#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    /// Bytes for the guest (all of the chunk, less escapes).
    Guest(Vec<u8>),
    /// End the VM (bytes before the escape still go to the guest).
    Quit(Vec<u8>),
}

impl EscapeParser {
    /// Parse `chunk`: escapes are removed; `Ctrl-A Ctrl-A` is one Ctrl-A;
    /// `Ctrl-A x` (or `X`) ends; `Ctrl-A` and another key sends both. An
    /// escape at a chunk's end waits for the next chunk.
    pub fn feed(&mut self, chunk: &[u8]) -> Input {
        let mut out = Vec::with_capacity(chunk.len());
        for &b in chunk {
            if self.escaped {
                self.escaped = false;
                match b {
                    ESCAPE => out.push(ESCAPE),
                    b if b.eq_ignore_ascii_case(&QUIT) => return Input::Quit(out),
                    b => out.extend_from_slice(&[ESCAPE, b]),
                }
            } else if b == ESCAPE {
                self.escaped = true;
            } else {
                out.push(b);
            }
        }
        Input::Guest(out)
    }
}

/// A terminal in raw mode; its settings come back when dropped.
pub struct RawTerminal {
    fd: RawFd,
    saved: libc::termios,
}

impl RawTerminal {
    /// Put terminal `fd` in raw mode (`cfmakeraw`: no echo, no line
    /// editing, no signals from keys, no output processing), or `None`
    /// when `fd` is not a terminal.
    pub fn enter(fd: RawFd) -> io::Result<Option<RawTerminal>> {
        // SAFETY: isatty only inspects the descriptor.
        if unsafe { libc::isatty(fd) } != 1 {
            return Ok(None);
        }
        // SAFETY: a zeroed termios is a valid buffer for tcgetattr to fill.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr writes into `saved`; the result is checked.
        if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut raw = saved;
        // SAFETY: cfmakeraw edits the struct it is given.
        unsafe { libc::cfmakeraw(&mut raw) };
        // Output keeps its newline translation: the VMM's own messages
        // (and the outcome) print on the same terminal.
        raw.c_oflag |= libc::OPOST | libc::ONLCR;
        // SAFETY: tcsetattr reads `raw`; the result is checked.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Some(RawTerminal { fd, saved }))
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        // SAFETY: restores the settings read in `enter`.
        if unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) } != 0 {
            tracing::warn!(
                "cannot restore the terminal's settings: {} (try `stty sane`)",
                io::Error::last_os_error()
            );
        }
    }
}

/// The thread that feeds standard input to COM1; stopped when dropped.
pub struct ConsoleInput {
    stop: Arc<EventFd>,
    /// Closed while the VM is paused: typed input waits (the escape still
    /// works), so a paused UART and its interrupt do not change.
    gate: Arc<Gate>,
    thread: Option<JoinHandle<()>>,
    _raw: Option<RawTerminal>,
}

impl ConsoleInput {
    /// Feed what `input` (standard input) gives to `devices`' COM1, and
    /// call `quit` on `Ctrl-A x`. A terminal goes to raw mode until the
    /// returned value is dropped.
    pub fn start(
        input: RawFd,
        devices: Arc<Devices>,
        quit: Box<dyn Fn() + Send>,
    ) -> io::Result<ConsoleInput> {
        let raw = RawTerminal::enter(input)?;
        if raw.is_some() {
            eprintln!("hover: the guest's console is this terminal; Ctrl-A x ends the VM");
        }
        let stop = Arc::new(EventFd::new(libc::EFD_NONBLOCK)?);
        let gate = Arc::new(Gate::default());
        let (stop_in, gate_in) = (stop.clone(), gate.clone());
        let thread =
            crate::seccomp::spawn(crate::seccomp::Kind::Console, "console".into(), move || {
                feed(input, &stop_in, &gate_in, &devices, &*quit)
            })?;
        Ok(ConsoleInput {
            stop,
            gate,
            thread: Some(thread),
            _raw: raw,
        })
    }

    /// Hold typed input (a pause): returns once none is being delivered.
    pub fn pause(&self) {
        self.gate.close();
    }

    /// Deliver it again.
    pub fn resume(&self) {
        self.gate.open();
    }
}

impl Drop for ConsoleInput {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // `_raw` drops after the thread: the terminal is restored last.
    }
}

/// How long to wait before offering held input to a full FIFO again.
const RETRY_MS: i32 = 10;

fn feed(input: RawFd, stop: &EventFd, gate: &Gate, devices: &Devices, quit: &dyn Fn()) {
    let mut parser = EscapeParser::default();
    let mut pending: VecDeque<u8> = VecDeque::new();
    let mut open = true;
    let mut warned = false;
    let mut buf = [0u8; 4096];
    loop {
        let mut fds = [
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                // A negative descriptor is skipped: input at its end.
                fd: if open { input } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let timeout = if pending.is_empty() { -1 } else { RETRY_MS };
        // SAFETY: `fds` is a valid array of two pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            tracing::warn!("console input stops: poll failed: {e}");
            return;
        }
        if fds[0].revents != 0 {
            return;
        }
        if fds[1].revents != 0 {
            // SAFETY: reads into `buf`, within its length.
            let got = unsafe { libc::read(input, buf.as_mut_ptr().cast(), buf.len()) };
            match got {
                0 => open = false,
                n if n < 0 => {
                    let e = io::Error::last_os_error();
                    if !matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                    ) {
                        tracing::warn!("console input ends: {e}");
                        open = false;
                    }
                }
                n => {
                    let (bytes, quitting) = match parser.feed(&buf[..n as usize]) {
                        Input::Guest(b) => (b, false),
                        Input::Quit(b) => (b, true),
                    };
                    let room = PENDING_MAX.saturating_sub(pending.len());
                    if bytes.len() > room && !warned {
                        tracing::warn!(
                            "the guest does not read its console; typed input beyond {PENDING_MAX} bytes is dropped"
                        );
                        warned = true;
                    }
                    pending.extend(&bytes[..bytes.len().min(room)]);
                    if quitting {
                        if let Some(_pass) = gate.try_enter() {
                            offer(devices, &mut pending);
                        }
                        quit();
                        return;
                    }
                }
            }
        }
        if let Some(_pass) = gate.try_enter() {
            offer(devices, &mut pending);
        }
    }
}

/// Give the UART as much of `pending` as its FIFO takes.
fn offer(devices: &Devices, pending: &mut VecDeque<u8>) {
    if pending.is_empty() {
        return;
    }
    let (front, _) = pending.as_slices();
    let taken = devices.serial.enqueue(front);
    pending.drain(..taken);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_keys_pass_through() {
        let mut p = EscapeParser::default();
        assert_eq!(p.feed(b"ls -l\r"), Input::Guest(b"ls -l\r".to_vec()));
        assert_eq!(
            p.feed(&[3]),
            Input::Guest(vec![3]),
            "Ctrl-C goes to the guest"
        );
    }

    #[test]
    fn ctrl_a_x_quits_after_sending_what_came_before() {
        let mut p = EscapeParser::default();
        assert_eq!(p.feed(b"ab\x01xcd"), Input::Quit(b"ab".to_vec()));
        let mut p = EscapeParser::default();
        assert_eq!(p.feed(b"\x01X"), Input::Quit(Vec::new()));
    }

    #[test]
    fn an_escape_split_across_reads_still_quits() {
        let mut p = EscapeParser::default();
        assert_eq!(p.feed(b"a\x01"), Input::Guest(b"a".to_vec()));
        assert_eq!(p.feed(b"x"), Input::Quit(Vec::new()));
    }

    #[test]
    fn ctrl_a_twice_sends_one_and_other_keys_send_both() {
        let mut p = EscapeParser::default();
        assert_eq!(p.feed(b"\x01\x01"), Input::Guest(vec![ESCAPE]));
        assert_eq!(p.feed(b"\x01b"), Input::Guest(vec![ESCAPE, b'b']));
    }

    #[test]
    fn raw_mode_is_entered_on_a_terminal_and_restored_when_dropped() {
        let (mut master, mut slave) = (0, 0);
        // SAFETY: openpty writes two descriptors; the result is checked.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "openpty: {}", io::Error::last_os_error());
        let attrs = |fd| {
            // SAFETY: zeroed termios filled by tcgetattr.
            let mut t: libc::termios = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            assert_eq!(unsafe { libc::tcgetattr(fd, &mut t) }, 0);
            t
        };
        let before = attrs(slave);
        assert_ne!(before.c_lflag & libc::ICANON, 0, "a new pty is canonical");
        let raw = RawTerminal::enter(slave)
            .unwrap()
            .expect("a pty is a terminal");
        let during = attrs(slave);
        assert_eq!(during.c_lflag & (libc::ICANON | libc::ECHO | libc::ISIG), 0);
        drop(raw);
        let after = attrs(slave);
        assert_eq!(after.c_lflag, before.c_lflag);
        assert_eq!(after.c_iflag, before.c_iflag);
        // SAFETY: closing the descriptors openpty gave.
        unsafe {
            libc::close(master);
            libc::close(slave);
        }
    }

    #[test]
    fn a_pipe_is_not_put_in_raw_mode() {
        let mut fds = [0; 2];
        // SAFETY: pipe writes two descriptors; the result is checked.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        assert!(RawTerminal::enter(fds[0]).unwrap().is_none());
        // SAFETY: closing the pipe's descriptors.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }
}
