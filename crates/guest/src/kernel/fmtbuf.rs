//! A fixed-size text buffer for `core::fmt`: console lines and report keys
//! are formatted into one, silently truncated at `N` bytes.

use core::fmt;

/// Up to `N` bytes of formatted text.
pub struct FmtBuf<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> FmtBuf<N> {
    /// Empty.
    pub const fn new() -> Self {
        FmtBuf {
            buf: [0; N],
            len: 0,
        }
    }

    /// The bytes written so far.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The text written so far, up to the last whole character.
    pub fn as_str(&self) -> &str {
        match core::str::from_utf8(self.bytes()) {
            Ok(s) => s,
            // Truncation may split a character: keep the valid prefix.
            Err(e) => core::str::from_utf8(&self.buf[..e.valid_up_to()]).unwrap_or(""),
        }
    }
}

impl<const N: usize> fmt::Write for FmtBuf<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let n = s.len().min(N - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}
