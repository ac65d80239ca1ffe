//! A man in the middle of a migration on Unix sockets: forwards one
//! connection both ways, and on demand cuts it or flips a byte inside the
//! payload of the next PAGES frame from the source (frames are parsed as
//! they pass: a 16-byte hello, then 24-byte headers with the payload length
//! at offset 8).

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

const PAGES: u32 = 2;

/// A fault at a byte offset of the source's stream.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// Cut both directions when this many bytes have passed.
    CutAt(u64),
    /// Flip a bit of the byte at this offset.
    FlipAt(u64),
    /// Hold everything the destination sends this long before passing it
    /// on (a slow return path: each answer arrives late).
    DelayBack(std::time::Duration),
}

/// The proxy; dropping it cuts the connection.
pub struct Proxy {
    socks: Arc<Mutex<Vec<UnixStream>>>,
    corrupt: Arc<AtomicBool>,
    /// Set once a byte was flipped.
    pub corrupted: Arc<AtomicBool>,
}

impl Proxy {
    /// Listen at `listen`; the first connection goes on to `target`.
    pub fn start(listen: &Path, target: &Path) -> Proxy {
        let l = UnixListener::bind(listen).unwrap();
        let target = target.to_path_buf();
        let socks: Arc<Mutex<Vec<UnixStream>>> = Arc::default();
        let corrupt = Arc::new(AtomicBool::new(false));
        let corrupted = Arc::new(AtomicBool::new(false));
        let (s2, c2, d2) = (socks.clone(), corrupt.clone(), corrupted.clone());
        std::thread::spawn(move || {
            let Ok((a, _)) = l.accept() else { return };
            let b = UnixStream::connect(&target).unwrap();
            s2.lock()
                .unwrap()
                .extend([a.try_clone().unwrap(), b.try_clone().unwrap()]);
            let (a2, b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
            std::thread::spawn(move || pump_back(b2, a2));
            pump_frames(a, b, c2, d2);
        });
        Proxy {
            socks,
            corrupt,
            corrupted,
        }
    }

    /// Forward the first connection at `listen` to `target`, with `fault`
    /// applied to the source's stream (no frame parsing: any byte).
    pub fn with_fault(listen: &Path, target: &Path, fault: Fault) -> Proxy {
        let l = UnixListener::bind(listen).unwrap();
        let target = target.to_path_buf();
        let socks: Arc<Mutex<Vec<UnixStream>>> = Arc::default();
        let s2 = socks.clone();
        std::thread::spawn(move || {
            let Ok((mut a, _)) = l.accept() else { return };
            let Ok(mut b) = UnixStream::connect(&target) else {
                return;
            };
            s2.lock()
                .unwrap()
                .extend([a.try_clone().unwrap(), b.try_clone().unwrap()]);
            let (a2, b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
            let delay = match fault {
                Fault::DelayBack(d) => d,
                _ => std::time::Duration::ZERO,
            };
            std::thread::spawn(move || pump_back_after(b2, a2, delay));
            let mut at = 0u64;
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = match a.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let chunk = &mut buf[..n];
                let end = at + n as u64;
                match fault {
                    Fault::CutAt(c) if c < end => {
                        let keep = (c - at) as usize;
                        let _ = b.write_all(&chunk[..keep]);
                        for s in s2.lock().unwrap().iter() {
                            let _ = s.shutdown(std::net::Shutdown::Both);
                        }
                        return;
                    }
                    Fault::FlipAt(f) if f >= at && f < end => chunk[(f - at) as usize] ^= 0x10,
                    _ => {}
                }
                if b.write_all(chunk).is_err() {
                    // The destination closed: the source must see it, as
                    // on a direct connection.
                    for s in s2.lock().unwrap().iter() {
                        let _ = s.shutdown(std::net::Shutdown::Both);
                    }
                    return;
                }
                at = end;
            }
            let _ = b.shutdown(std::net::Shutdown::Write);
        });
        Proxy {
            socks,
            corrupt: Arc::default(),
            corrupted: Arc::default(),
        }
    }

    /// Cut both sides now.
    pub fn cut(&self) {
        for s in self.socks.lock().unwrap().iter() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Flip a byte in the payload of the next PAGES frame from the source.
    pub fn corrupt_next_pages(&self) {
        self.corrupt.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
    }
}

fn pump_back(from: UnixStream, to: UnixStream) {
    pump_back_after(from, to, std::time::Duration::ZERO)
}

/// Forward what the destination sends, each read held `delay` first.
fn pump_back_after(mut from: UnixStream, mut to: UnixStream, delay: std::time::Duration) {
    let mut buf = vec![0u8; 1 << 16];
    while let Ok(n) = from.read(&mut buf) {
        std::thread::sleep(delay);
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

fn pump_frames(
    mut from: UnixStream,
    mut to: UnixStream,
    corrupt: Arc<AtomicBool>,
    corrupted: Arc<AtomicBool>,
) {
    let mut hello = [0u8; 16];
    if from.read_exact(&mut hello).is_err() || to.write_all(&hello).is_err() {
        return;
    }
    loop {
        let mut h = [0u8; 24];
        if from.read_exact(&mut h).is_err() {
            break;
        }
        let kind = u32::from_le_bytes(h[0..4].try_into().unwrap());
        let len = u64::from_le_bytes(h[8..16].try_into().unwrap()) as usize;
        let mut payload = vec![0u8; len];
        if from.read_exact(&mut payload).is_err() {
            break;
        }
        if kind == PAGES && len > 100 && corrupt.swap(false, Ordering::SeqCst) {
            // Inside the last page's contents: only the CRC can tell.
            payload[len - 100] ^= 0x40;
            corrupted.store(true, Ordering::SeqCst);
        }
        if to.write_all(&h).is_err() || to.write_all(&payload).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}
