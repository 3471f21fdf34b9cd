//! Reading a sealed segment's secondary-index file (`.six`): from disk, or
//! from memory once built, block by block.

use super::*;

/// Where a loaded index file's bytes are.
#[derive(Debug)]
pub(super) enum Source {
    /// Built in memory, not written yet.
    Memory(Vec<u8>),
    /// On disk.
    File(Arc<dyn VfsFile>),
}

/// A sealed segment's index: its directory in memory, its blocks read on
/// demand (and checked on every read).
#[derive(Debug)]
pub struct SixFile {
    pub(super) meta: SixMeta,
    pub(super) source: Source,
    pub(super) path: String,
}

impl SixFile {
    /// Opens and checks an index file against the segment it must describe.
    pub(super) fn open(vfs: &dyn Vfs, path: &str, expect: &SixHeader) -> std::result::Result<SixFile, SixError> {
        let damaged = |r: String| SixError::Damaged(r.into());
        let f = vfs.open(path, false).map_err(|e| damaged(format!("open: {e}")))?;
        let len = f.len().map_err(|e| damaged(format!("stat: {e}")))?;
        if len < (file::SIX_HEADER_LEN + file::SIX_TRAILER_LEN) as u64 {
            return Err(damaged("index file too short".into()));
        }
        let head = read_exact(&*f, 0, file::SIX_HEADER_LEN).map_err(|e| damaged(format!("read: {e}")))?;
        let header = SixHeader::decode(&head)?;
        if header != *expect {
            return Err(damaged(format!("describes {header:?}, the segment is {expect:?}")));
        }
        let trailer = read_exact(&*f, len - file::SIX_TRAILER_LEN as u64, file::SIX_TRAILER_LEN)
            .map_err(|e| damaged(format!("read: {e}")))?;
        let (offset, dlen, crc) = file::decode_trailer(&trailer, len)?;
        let dir = read_exact(&*f, offset, dlen as usize).map_err(|e| damaged(format!("read: {e}")))?;
        let meta = file::decode_dir(header, &dir, offset, crc)?;
        Ok(SixFile { meta, source: Source::File(f), path: path.to_owned() })
    }

    pub(super) fn in_memory(bytes: Vec<u8>, path: String) -> std::result::Result<SixFile, SixError> {
        let header = SixHeader::decode(&bytes)?;
        let t = bytes.len().checked_sub(file::SIX_TRAILER_LEN).ok_or(SixError::Damaged("too short".into()))?;
        let (offset, dlen, crc) = file::decode_trailer(&bytes[t..], bytes.len() as u64)?;
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let dir = bytes.get(start..start + dlen as usize).ok_or(SixError::Damaged("directory".into()))?;
        let meta = file::decode_dir(header, dir, offset, crc)?;
        Ok(SixFile { meta, source: Source::Memory(bytes), path })
    }

    /// The file's path (in messages).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The byte offset of record `seq` in its segment, from the file's
    /// offset table (checked by the caller against the record found there).
    pub(super) fn offset_of(&self, seq: u64) -> Option<u64> {
        let m = &self.meta;
        if m.offsets == 0 || seq < m.header.base_seq || seq > m.header.last_seq {
            return None;
        }
        let at = m.offsets_at + (seq - m.header.base_seq) * 4;
        let b: [u8; 4] = match &self.source {
            Source::Memory(bytes) => {
                let i = usize::try_from(at).ok()?;
                bytes.get(i..i + 4)?.try_into().ok()?
            }
            Source::File(f) => read_exact(&**f, at, 4).ok()?.try_into().ok()?,
        };
        Some(u64::from(u32::from_le_bytes(b)))
    }

    /// The fields it covers.
    pub fn fields(&self) -> &[String] {
        &self.meta.fields
    }

    pub(super) fn block_bytes(&self, i: usize) -> std::result::Result<std::borrow::Cow<'_, [u8]>, SixError> {
        let b = &self.meta.blocks[i];
        match &self.source {
            Source::Memory(bytes) => {
                let at = usize::try_from(b.offset).unwrap_or(usize::MAX);
                bytes
                    .get(at..at + b.len as usize)
                    .map(std::borrow::Cow::Borrowed)
                    .ok_or(SixError::Damaged("block out of range".into()))
            }
            Source::File(f) => read_exact(&**f, b.offset, b.len as usize)
                .map(std::borrow::Cow::Owned)
                .map_err(|e| SixError::Damaged(format!("read: {e}").into())),
        }
    }

    /// The sequences of `field` whose values fall in any of `ranges`;
    /// `Ok(None)` when the field is not covered or more than `cap` match.
    pub(super) fn lookup(
        &self,
        field: &str,
        ranges: &[KeyRange],
        cap: u64,
    ) -> std::result::Result<Option<Vec<u64>>, SixError> {
        let Some(ord) = self.meta.ordinal(field) else { return Ok(None) };
        let mut out = Vec::new();
        for r in ranges {
            if self.meta.span_excludes(ord, r) {
                continue;
            }
            let r = file::term_range(ord, r);
            if self.meta.excludes(&r.lo, &r.hi) {
                continue;
            }
            let start = match &r.lo {
                std::ops::Bound::Included(k) | std::ops::Bound::Excluded(k) => self.meta.block_for(k),
                std::ops::Bound::Unbounded => 0,
            };
            'blocks: for i in start..self.meta.blocks.len() {
                let bytes = self.block_bytes(i)?;
                let mut it = self.meta.block(i, &bytes)?;
                while let Some(e) = it.next_entry()? {
                    let past = match &r.hi {
                        std::ops::Bound::Included(h) => e.key > h.as_slice(),
                        std::ops::Bound::Excluded(h) => e.key >= h.as_slice(),
                        std::ops::Bound::Unbounded => false,
                    };
                    if past {
                        break 'blocks;
                    }
                    if r.contains(e.key) {
                        if out.len() as u64 + e.count > cap {
                            return Ok(None);
                        }
                        e.sequences(&self.meta.header, &mut out)?;
                    }
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(Some(out))
    }
}

pub(super) fn read_exact(f: &dyn VfsFile, at: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let n = f.read_at(&mut buf[done..], at + done as u64)?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "file ends early"));
        }
        done += n;
    }
    Ok(buf)
}
