//! Text and bytes that share memory: [`Text`], the UTF-8 an event's id,
//! key and type are held in, and [`shared_copy`], which cuts small copies
//! from a per-thread chunk so that an append does not allocate once per
//! part of its event.

use bytes::{Bytes, BytesMut};

/// Text that shares the bytes it was read from or cut from.
///
/// Its bytes are UTF-8: it is made only here, from a `String`, a `&str`,
/// or bytes checked by `msgpack::is_utf8` (the field is private to this module), so
/// reading it as `&str` does not check again (an event's id, key and type
/// are read on every event a consumer handles).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Text(Bytes);

impl Text {
    pub(crate) fn from_string(s: String) -> Text {
        Text(Bytes::from(s))
    }
    /// A copy of `s`, cut from this thread's shared chunk
    /// ([`shared_copy`]): no allocation of its own.
    pub(crate) fn copied(s: &str) -> Text {
        Text(shared_copy(s.as_bytes()))
    }
    /// `Some` when `b` is UTF-8.
    pub(crate) fn checked(b: Bytes) -> Option<Text> {
        crate::msgpack::is_utf8(&b).then_some(Text(b))
    }
    pub(crate) fn as_str(&self) -> &str {
        debug_assert!(std::str::from_utf8(&self.0).is_ok());
        #[expect(unsafe_code, reason = "checked when made (see the type's doc); this is read on every event")]
        // SAFETY: every `Text` is made by `from_string` (a `String`'s
        // bytes), `copied` (a `&str`'s bytes) or `checked` (bytes `is_utf8` accepted, which accepts
        // exactly what `std::str::from_utf8` does: a property test in
        // `msgpack`), and its bytes never change (`Bytes` is immutable).
        unsafe {
            std::str::from_utf8_unchecked(&self.0)
        }
    }
}

impl std::ops::Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Text {
        Text::copied(s)
    }
}

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

thread_local! {
    /// Where [`shared_copy`] cuts its copies from.
    static CHUNK: std::cell::RefCell<BytesMut> = std::cell::RefCell::new(BytesMut::new());
}

/// The size of the chunks [`shared_copy`] cuts small copies from.
const CHUNK_BYTES: usize = 8 * 1024;

/// The largest copy [`shared_copy`] cuts from a chunk; a larger one gets
/// an allocation of its own.
const CHUNK_MAX_COPY: usize = 1024;

/// A copy of `b` that costs no allocation of its own when small: it is cut
/// from this thread's current chunk of [`CHUNK_BYTES`], which the copies
/// share (two allocations per chunk: the chunk and its reference count).
/// An appended event's id, payload and strings come from here, so an
/// append allocates for its event once, not once per part.
///
/// The price: a copy kept alive keeps its whole chunk alive, as an event
/// read keeps its read buffer. An event's parts are copied at different
/// moments (its key when the options are built, its payload when encoded,
/// its id at the append), so one kept event may hold up to three chunks.
pub(crate) fn shared_copy(b: &[u8]) -> Bytes {
    if b.len() > CHUNK_MAX_COPY {
        return Bytes::copy_from_slice(b);
    }
    let cut = |chunk: &std::cell::RefCell<BytesMut>| {
        let mut chunk = chunk.try_borrow_mut().ok()?;
        if chunk.capacity() - chunk.len() < b.len() {
            *chunk = BytesMut::with_capacity(CHUNK_BYTES);
        }
        chunk.extend_from_slice(b);
        Some(chunk.split().freeze())
    };
    // A thread being torn down gets a copy of its own.
    CHUNK.try_with(cut).ok().flatten().unwrap_or_else(|| Bytes::copy_from_slice(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Copies cut from a thread's chunk keep their bytes when the chunk
    /// rolls over, share it while it lasts, and a large copy gets its own.
    #[test]
    fn shared_copies_keep_their_bytes_across_chunks() {
        let copies: Vec<(Vec<u8>, Bytes)> = (0..2_000u32)
            .map(|i| {
                let b: Vec<u8> = (0..(i % 700) as usize).map(|j| (i as usize * 31 + j).to_le_bytes()[0]).collect();
                let c = shared_copy(&b);
                (b, c)
            })
            .collect();
        for (want, got) in &copies {
            assert_eq!(&got[..], &want[..]);
        }
        // Of two pairs in a row, at most one straddles a new chunk.
        let side_by_side = (0..2).any(|_| {
            let (a, b) = (shared_copy(b"abc"), shared_copy(b"def"));
            (&a[..], &b[..]) == (&b"abc"[..], &b"def"[..]) && distance(&a, &b) == Some(3)
        });
        assert!(side_by_side, "two small copies in a row lie side by side in one chunk");
        let big = vec![7u8; CHUNK_MAX_COPY + 1];
        assert_eq!(&shared_copy(&big)[..], &big[..]);
    }

    /// How far `b` starts after `a` in memory, when after it.
    fn distance(a: &Bytes, b: &Bytes) -> Option<usize> {
        (b.as_ptr() as usize).checked_sub(a.as_ptr() as usize)
    }
}
