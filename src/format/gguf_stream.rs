//! Loading a GGUF file from a stream of chunks (a `fetch` body, a `File` read in slices)
//! without ever holding the whole file: the header is parsed as soon as it has arrived, then
//! each tensor is handed to the caller (for the GPU upload) the moment its last byte arrives,
//! and its bytes are dropped. Peak memory is the header plus the largest tensor.

use super::gguf::{GgufHeader, GgufTensorInfo};
use crate::error::{Error, Result};

/// Header bytes to collect before the first parse attempt; each failed attempt doubles it,
/// so a header of `n` bytes is parsed O(log n) times.
const FIRST_HEADER_ATTEMPT: usize = 64 * 1024;

/// An incremental GGUF reader. Feed it with [`GgufStream::push`], then call
/// [`GgufStream::finish`].
#[derive(Debug)]
pub struct GgufStream {
    file: String,
    total_len: u64,
    /// Bytes received so far.
    received: u64,
    /// Until the header is parsed: every byte from the start. After: the bytes from
    /// `buf_start` on that a pending tensor still needs.
    buf: Vec<u8>,
    buf_start: u64,
    next_attempt: usize,
    header: Option<GgufHeader>,
    /// Tensor indices in file order, and how many have been delivered.
    order: Vec<usize>,
    delivered: usize,
}

impl GgufStream {
    /// A reader for a file called `file` of `total_len` bytes (from `Content-Length` or
    /// `File.size`; the stream must deliver exactly that many bytes).
    pub fn new(file: &str, total_len: u64) -> Self {
        Self {
            file: file.to_string(),
            total_len,
            received: 0,
            buf: Vec::new(),
            buf_start: 0,
            next_attempt: FIRST_HEADER_ATTEMPT,
            header: None,
            order: Vec::new(),
            delivered: 0,
        }
    }

    /// The header, once enough bytes have arrived.
    pub fn header(&self) -> Option<&GgufHeader> {
        self.header.as_ref()
    }

    /// Bytes received so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Bytes held right now (header bytes, or the part of the file pending tensors need).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Takes the next chunk. `on_tensor(header, info, bytes)` is called, in file order, for
    /// every tensor whose bytes are now complete.
    pub fn push(
        &mut self,
        chunk: &[u8],
        mut on_tensor: impl FnMut(&GgufHeader, &GgufTensorInfo, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let len = chunk.len() as u64;
        if self.received.saturating_add(len) > self.total_len {
            return Err(Error::format(
                &self.file,
                format!(
                    "the stream delivered more than the announced {} bytes",
                    self.total_len
                ),
            ));
        }
        self.received = self.received.saturating_add(len);
        self.buf.extend_from_slice(chunk);
        if self.header.is_none() {
            let complete = self.received == self.total_len;
            if self.buf.len() < self.next_attempt && !complete {
                return Ok(());
            }
            match GgufHeader::parse_prefix(&self.buf, self.total_len, &self.file)? {
                None if complete => {
                    return Err(Error::format(&self.file, "truncated header"));
                }
                None => {
                    self.next_attempt = self.buf.len().saturating_mul(2);
                    return Ok(());
                }
                Some(header) => {
                    let mut order: Vec<usize> = (0..header.tensors().len()).collect();
                    order.sort_by_key(|&i| header.tensors()[i].offset);
                    self.order = order;
                    self.header = Some(header);
                }
            }
        }
        self.deliver(&mut on_tensor)
    }

    fn deliver(
        &mut self,
        on_tensor: &mut impl FnMut(&GgufHeader, &GgufTensorInfo, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let Some(header) = &self.header else {
            return Ok(());
        };
        let buf_end = self.buf_start.saturating_add(self.buf.len() as u64);
        while let Some(&i) = self.order.get(self.delivered) {
            let info = &header.tensors()[i];
            let range = header.tensor_range(info);
            if range.end > buf_end {
                break;
            }
            // Ranges were checked against the file when the header was parsed; a range that
            // starts before the buffer means two tensors overlap, which this reader refuses.
            let (Some(from), Some(to)) = (
                range.start.checked_sub(self.buf_start),
                range.end.checked_sub(self.buf_start),
            ) else {
                return Err(Error::format(
                    &self.file,
                    format!("tensor `{}` overlaps the tensor before it", info.name),
                ));
            };
            on_tensor(header, info, &self.buf[from as usize..to as usize])?;
            self.delivered = self.delivered.saturating_add(1);
        }
        // Keep only what the next tensor still needs.
        let keep_from = match self.order.get(self.delivered) {
            Some(&i) => header.tensor_range(&header.tensors()[i]).start,
            None => buf_end,
        }
        .clamp(self.buf_start, buf_end);
        let drop = keep_from.saturating_sub(self.buf_start) as usize;
        if drop > 0 {
            self.buf.drain(..drop);
            self.buf_start = keep_from;
        }
        Ok(())
    }

    /// Ends the stream: the header, or an error when bytes or tensors are missing.
    pub fn finish(self) -> Result<GgufHeader> {
        if self.received != self.total_len {
            return Err(Error::format(
                &self.file,
                format!(
                    "the stream ended after {} of {} bytes",
                    self.received, self.total_len
                ),
            ));
        }
        let header = self
            .header
            .ok_or_else(|| Error::format(&self.file, "truncated header"))?;
        if self.delivered != header.tensors().len() {
            return Err(Error::format(
                &self.file,
                format!(
                    "only {} of {} tensors arrived",
                    self.delivered,
                    header.tensors().len()
                ),
            ));
        }
        Ok(header)
    }
}
