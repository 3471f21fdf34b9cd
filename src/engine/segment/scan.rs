//! Sequential, buffered, checksum-verifying reads of a segment's records.

use std::io;
use std::ops::Deref;

use bytes::{Bytes, BytesMut};

use super::format::{FRAME_LEN, MAX_BODY_LEN};
use super::record::{Decoded, RecordHeader, decode_doc, decode_record};
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

    /// Reads the document (see [`Document::parse`]), sharing the read
    /// buffer instead of copying (see [`Doc::share`]).
    pub fn decode(&self) -> Result<Document, crate::decode::DecodeError> {
        Document::parse(self.share())
    }

    /// As [`Doc::decode`], from a copy of the document's bytes: for a read
    /// that keeps few of the records it passes (a filtered scan, the
    /// scattered records of a query), where sharing would keep a whole
    /// buffer alive for each record kept.
    pub fn decode_copy(&self) -> Result<Document, crate::decode::DecodeError> {
        decode_doc(self.bytes())
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::engine::segment::format::FLAG_END;
    use crate::engine::segment::record::{DocRef, encode_record};
    use crate::engine::vfs::MemVfs;
    use crate::engine::vfs::Vfs;
    use crate::model::payload::Metadata;

    /// Records 1..=n, each with a payload of a different size, in one file.
    fn file(n: u64) -> (Arc<dyn VfsFile>, Vec<Vec<u8>>, u64) {
        let (mut bytes, mut docs) = (Vec::new(), Vec::new());
        let meta = Metadata::new();
        for seq in 1..=n {
            let payload = rmp_serde::to_vec(&"x".repeat(usize::try_from(seq % 50).expect("small"))).expect("payload");
            let id = format!("id-{seq}");
            let start = bytes.len();
            let h = RecordHeader { seq, ts: 1, flags: FLAG_END, txn: 0 };
            encode_record(&mut bytes, &h, &DocRef(&id, None, Some("t"), &meta, &payload)).expect("encode");
            docs.push(bytes[start + FRAME_LEN + super::super::format::BODY_DOC..].to_vec());
        }
        let vfs = MemVfs::new();
        vfs.write_file("s.log", &bytes).expect("write");
        let len = bytes.len() as u64;
        (vfs.open("s.log", false).expect("open"), docs, len)
    }

    #[test]
    fn a_shared_document_keeps_its_bytes_while_the_scan_reads_on() {
        let (f, docs, len) = file(400);
        // A small chunk: the scan refills its buffer many times, reusing it
        // when no document holds it and moving to a new one when one does.
        let mut scanner = Scanner::with_chunk(&*f, 0, len, 512);
        let mut kept = Vec::new();
        let mut copies = Vec::new();
        while let Step::Record { header, doc, .. } = scanner.next_step().expect("read") {
            if header.seq % 7 == 0 {
                kept.push((header.seq, doc.share()));
            } else {
                copies.push((header.seq, doc.decode_copy().expect("a document")));
            }
        }
        assert_eq!(kept.len() + copies.len(), 400, "every record was scanned");
        for (seq, bytes) in &kept {
            assert_eq!(&bytes[..], &docs[usize::try_from(*seq - 1).expect("small")][..], "record {seq}");
        }
        for (seq, d) in &copies {
            assert_eq!(d.id(), format!("id-{seq}"));
        }
    }

    #[test]
    fn a_decoded_document_reads_as_the_record_wrote_it() {
        let (f, _, len) = file(3);
        let mut scanner = Scanner::new(&*f, 0, len);
        let Step::Record { doc, .. } = scanner.next_step().expect("read") else { panic!("no record") };
        let (shared, copied) = (doc.decode().expect("decode"), doc.decode_copy().expect("decode"));
        assert_eq!(shared, copied);
        assert_eq!((shared.id(), shared.event_type()), ("id-1", Some("t")));
    }
}
