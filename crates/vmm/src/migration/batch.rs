//! Gathering guest pages into PAGES frames, shared by the VMM's own sending
//! thread and the separate sender process: read a batch of pages (each
//! caller reads its own way), leave out pages of zeros when asked, and send
//! a frame whenever `batch` pages are gathered.

use std::io::{self, Write};

use hover_abi::layout::PAGE_SIZE;

use super::wire::FrameWriter;
use crate::state::memory::is_zero;

/// Reads the pages at the addresses given into the buffer, a page each.
pub type ReadPages<'a> = dyn FnMut(&[u64], &mut [u8]) -> io::Result<()> + 'a;

/// Why a batch could not be sent.
#[derive(Debug)]
pub enum BatchError {
    /// Reading guest memory failed.
    Read(io::Error),
    /// Writing a frame failed.
    Write(io::Error),
}

/// Pages gathered into frames of `batch` pages.
pub struct Batcher {
    batch: usize,
    /// Pages read out of guest memory, a batch at a time.
    scratch: Vec<u8>,
    buf: Vec<u8>,
    gpas: Vec<u64>,
}

impl Batcher {
    /// Frames of `batch` pages.
    pub fn new(batch: usize) -> Self {
        let ps = PAGE_SIZE as usize;
        Batcher {
            batch,
            scratch: vec![0; batch * ps],
            buf: Vec::with_capacity(batch * ps),
            gpas: Vec::with_capacity(batch),
        }
    }

    /// Send the pages at `gpas` on `w`, reading them with `read` (a page
    /// each into the buffer given), pages of zeros left out if
    /// `skip_zero`; `after_frame` runs after each frame (pacing). Pages sent.
    pub fn send<W: Write>(
        &mut self,
        w: &mut FrameWriter<W>,
        gpas: &[u64],
        skip_zero: bool,
        read: &mut ReadPages<'_>,
        after_frame: &mut dyn FnMut(&FrameWriter<W>),
    ) -> Result<u64, BatchError> {
        let ps = PAGE_SIZE as usize;
        let mut sent = 0;
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = (|| {
            for chunk in gpas.chunks(self.batch) {
                let pages = &mut scratch[..chunk.len() * ps];
                read(chunk, pages).map_err(BatchError::Read)?;
                for (&gpa, page) in chunk.iter().zip(pages.chunks_exact(ps)) {
                    if skip_zero && is_zero(page) {
                        continue;
                    }
                    self.gpas.push(gpa);
                    self.buf.extend_from_slice(page);
                    if self.gpas.len() == self.batch {
                        sent += self.flush(w, after_frame)?;
                    }
                }
            }
            sent += self.flush(w, after_frame)?;
            Ok(sent)
        })();
        self.scratch = scratch;
        result
    }

    /// Read the pages at `gpas` with `read`, a batch at a time, and send
    /// nothing (what reading alone costs). Pages read.
    pub fn read_only(&mut self, gpas: &[u64], read: &mut ReadPages<'_>) -> io::Result<u64> {
        let ps = PAGE_SIZE as usize;
        for chunk in gpas.chunks(self.batch) {
            read(chunk, &mut self.scratch[..chunk.len() * ps])?;
        }
        Ok(gpas.len() as u64)
    }

    fn flush<W: Write>(
        &mut self,
        w: &mut FrameWriter<W>,
        after_frame: &mut dyn FnMut(&FrameWriter<W>),
    ) -> Result<u64, BatchError> {
        if self.gpas.is_empty() {
            return Ok(0);
        }
        w.send_pages(&self.gpas, &self.buf)
            .map_err(BatchError::Write)?;
        let n = self.gpas.len() as u64;
        self.gpas.clear();
        self.buf.clear();
        after_frame(w);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migration::page_lists::split_pages;
    use crate::migration::wire::FrameReader;

    #[test]
    fn pages_go_in_frames_of_the_batch_size_zeros_left_out_on_request() {
        let mut out = FrameWriter::new(Vec::new());
        let mut b = Batcher::new(2);
        let gpas = [0, 4096, 8192, 12288, 16384];
        // Page 4096 is all zeros; the others hold their index + 1.
        let mut read = |g: &[u64], buf: &mut [u8]| {
            for (gpa, page) in g.iter().zip(buf.chunks_exact_mut(4096)) {
                page.fill(if *gpa == 4096 {
                    0
                } else {
                    (gpa / 4096) as u8 + 1
                });
            }
            Ok(())
        };
        let mut frames = 0;
        let sent = b
            .send(&mut out, &gpas, true, &mut read, &mut |_| frames += 1)
            .unwrap();
        assert_eq!((sent, frames), (4, 2));
        let bytes = out_bytes(out);
        let mut r = FrameReader::new(bytes.as_slice());
        let mut got = Vec::new();
        for _ in 0..2 {
            let f = r.frame().unwrap();
            let (g, data) = split_pages(&f.payload).unwrap();
            for (gpa, page) in g.iter().zip(data.chunks(4096)) {
                assert!(page.iter().all(|&x| x == (gpa / 4096) as u8 + 1));
                got.push(*gpa);
            }
        }
        assert_eq!(got, [0, 8192, 12288, 16384]);
        // Without skipping, the zero page goes too.
        let mut out = FrameWriter::new(Vec::new());
        let sent = b
            .send(&mut out, &gpas, false, &mut read, &mut |_| {})
            .unwrap();
        assert_eq!(sent, 5);
        let e = b
            .send(
                &mut out,
                &gpas,
                false,
                &mut |_, _| Err(io::Error::other("gone")),
                &mut |_| {},
            )
            .unwrap_err();
        assert!(matches!(e, BatchError::Read(_)));
    }

    fn out_bytes(w: FrameWriter<Vec<u8>>) -> Vec<u8> {
        w.into_inner()
    }
}
