//! Sequential, buffered, checksum-verifying reads of a segment's records.

use std::io;
use std::ops::Deref;

use bytes::{Bytes, BytesMut};

use super::format::{FRAME_LEN, MAX_BODY_LEN};
use super::record::{Decoded, RecordHeader, decode_record};
use crate::engine::vfs::VfsFile;
use crate::model::event::Document;

/// The read size of a scan.
const CHUNK: usize = 256 << 10;

/// One step of a scan.
#[derive(Debug)]
pub enum Step<'a> {
    /// A valid record at `offset`.
    Record {
        /// Where it starts.
        offset: u64,
        /// Its fixed fields.
        header: RecordHeader,
        /// Its MessagePack document.
        doc: Doc<'a>,
    },
    /// No more records: zeros, a footer, or the end of the file, at `offset`.
    End {
        /// Where the records end.
        offset: u64,
        /// True when a footer starts there.
        footer: bool,
    },
    /// A record at `offset` runs past the end of the file (a torn write).
    Truncated {
        /// Where it starts.
        offset: u64,
    },
    /// The bytes at `offset` are not a valid record.
    Invalid {
        /// Where they start.
        offset: u64,
        /// Why.
        reason: &'static str,
    },
}

/// A record's document as a scan found it: its bytes in the scan's read
/// buffer, which [`Doc::share`] hands out without copying.
#[derive(Clone, Copy)]
pub struct Doc<'a> {
    chunk: &'a Bytes,
    start: usize,
    end: usize,
}

impl<'a> Doc<'a> {
    /// The document's bytes, borrowed from the read buffer.
    pub fn bytes(&self) -> &'a [u8] {
        // In range by construction: `next_step` made it from a record it
        // found whole in `chunk`.
        self.chunk.get(self.start..self.end).unwrap_or_default()
    }

    /// The document as shared bytes: a reference to the scan's read buffer
    /// (one buffer of at most the scan's chunk size, or one record when a
    /// record is larger), not a copy. The buffer lives while any document
    /// shared from it does, and the scan moves on to a new buffer.
    pub fn share(&self) -> Bytes {
        if self.end <= self.chunk.len() && self.start <= self.end {
            self.chunk.slice(self.start..self.end)
        } else {
            Bytes::new()
        }
    }
}

impl Doc<'_> {
    /// Reads the document (see [`Document::parse`]), sharing the read
    /// buffer instead of copying (see [`Doc::share`]).
    pub fn decode(&self) -> Result<Document, crate::decode::DecodeError> {
        Document::parse(self.share())
    }
}

impl Deref for Doc<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes()
    }
}

impl std::fmt::Debug for Doc<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Doc({} bytes)", self.end - self.start)
    }
}

/// Scans records from an offset, reading `CHUNK` bytes at a time and never
/// more than one record's size beyond that.
///
/// Its read buffer is shared with the documents a caller keeps
/// ([`Doc::share`]): a buffer no document holds is reused for the next
/// read; one that is held stays with its documents, and the next read goes
/// into a new buffer.
pub struct Scanner<'f> {
    file: &'f dyn VfsFile,
    /// The end of readable data (the file length when the scan started, or
    /// a records_end).
    limit: u64,
    pos: u64,
    buf: Bytes,
    buf_start: u64,
    chunk: usize,
}

impl<'f> Scanner<'f> {
    /// Scans `file` from `offset` up to `limit` bytes.
    pub fn new(file: &'f dyn VfsFile, offset: u64, limit: u64) -> Self {
        Scanner::with_chunk(file, offset, limit, CHUNK)
    }

    /// As [`Scanner::new`], reading `chunk` bytes at a time (small for
    /// point reads, which would waste a large read).
    pub fn with_chunk(file: &'f dyn VfsFile, offset: u64, limit: u64, chunk: usize) -> Self {
        Scanner { file, limit, pos: offset, buf: Bytes::new(), buf_start: offset, chunk }
    }

    /// The offset of the next record.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Makes at least `need` bytes from `pos` available (fewer at the limit).
    fn fill(&mut self, need: usize) -> io::Result<()> {
        let have_from = self.pos.saturating_sub(self.buf_start);
        let have = (self.buf.len() as u64).saturating_sub(have_from);
        if self.pos >= self.buf_start && have >= need as u64 {
            return Ok(());
        }
        let available = self.limit.saturating_sub(self.pos);
        let want = u64::try_from(need.max(self.chunk)).unwrap_or(u64::MAX).min(available);
        let want = usize::try_from(want).unwrap_or(usize::MAX);
        // The old buffer back when no document holds it; else a new one.
        let mut buf = match std::mem::take(&mut self.buf).try_into_mut() {
            Ok(mut b) => {
                b.clear();
                b
            }
            // Zeroed by the allocator (fresh pages come zeroed).
            Err(_) => BytesMut::zeroed(want),
        };
        buf.resize(want, 0);
        let n = self.file.read_at(&mut buf, self.pos)?;
        buf.truncate(n);
        self.buf = buf.freeze();
        self.buf_start = self.pos;
        Ok(())
    }

    /// The next step. After `End`, `Truncated` or `Invalid` the scan stays put.
    pub fn next_step(&mut self) -> io::Result<Step<'_>> {
        self.fill(FRAME_LEN)?;
        let mut need = FRAME_LEN;
        loop {
            let at = usize::try_from(self.pos - self.buf_start).unwrap_or(usize::MAX);
            let view = self.buf.get(at..).unwrap_or(&[]);
            if view.is_empty() {
                return Ok(Step::End { offset: self.pos, footer: false });
            }
            match decode_record(view) {
                Decoded::Incomplete(n) if n > need && (n as u64) <= u64::from(MAX_BODY_LEN) + FRAME_LEN as u64 => {
                    need = n;
                    self.fill(n)?;
                }
                Decoded::Incomplete(_) => return Ok(Step::Truncated { offset: self.pos }),
                Decoded::End => return Ok(Step::End { offset: self.pos, footer: false }),
                Decoded::Footer => return Ok(Step::End { offset: self.pos, footer: true }),
                Decoded::Invalid(reason) => return Ok(Step::Invalid { offset: self.pos, reason }),
                Decoded::Record { header, size, .. } => {
                    let offset = self.pos;
                    self.pos += size as u64;
                    // Re-borrow the document from the buffer for the caller.
                    let at = usize::try_from(offset - self.buf_start).unwrap_or(usize::MAX);
                    let doc = Doc { chunk: &self.buf, start: at + FRAME_LEN + super::format::BODY_DOC, end: at + size };
                    return Ok(Step::Record { offset, header, doc });
                }
            }
        }
    }
}
