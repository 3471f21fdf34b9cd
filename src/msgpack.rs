//! A MessagePack reader over borrowed bytes: enough to walk a record's
//! document (`[id, key, type, metadata, payload]`) without decoding it into
//! JSON values. Shared by the index builder's field extractor and the lazy
//! event view. Bad input is never a panic: a malformed value reads as
//! `None`, and nesting is walked iteratively.

/// A scalar value read from a record, borrowed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar<'a> {
    /// null (also a non-finite float, which JSON turns into null).
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i128),
    /// A float.
    Float(f64),
    /// A string's bytes.
    Str(&'a [u8]),
    /// An array or object.
    Other,
}

/// A cursor over MessagePack bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

/// What a marker starts.
pub(crate) enum Item<'a> {
    Scalar(Scalar<'a>),
    Array(usize),
    Map(usize),
    /// A value with no JSON meaning (bin, ext): skipped, never indexed.
    Opaque,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `b`.
    pub(crate) fn new(b: &'a [u8]) -> Self {
        Reader { b, pos: 0 }
    }
    /// Where the reader is.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.b.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }
    pub(crate) fn be<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N).and_then(|s| s.try_into().ok())
    }
    pub(crate) fn len(&mut self, bytes: usize) -> Option<usize> {
        let n = match bytes {
            1 => u64::from(self.u8()?),
            2 => u64::from(u16::from_be_bytes(self.be()?)),
            _ => u64::from(u32::from_be_bytes(self.be()?)),
        };
        usize::try_from(n).ok()
    }

    pub(crate) fn item(&mut self) -> Option<Item<'a>> {
        let m = self.u8()?;
        let s = |v| Some(Item::Scalar(v));
        match m {
            0x00..=0x7f => s(Scalar::Int(i128::from(m))),
            0x80..=0x8f => Some(Item::Map(usize::from(m & 0x0f))),
            0x90..=0x9f => Some(Item::Array(usize::from(m & 0x0f))),
            0xa0..=0xbf => s(Scalar::Str(self.take(usize::from(m & 0x1f))?)),
            0xc0 => s(Scalar::Null),
            0xc2 => s(Scalar::Bool(false)),
            0xc3 => s(Scalar::Bool(true)),
            0xc4..=0xc6 => {
                let n = self.len(1 << (m - 0xc4))?;
                self.take(n)?;
                Some(Item::Opaque)
            }
            0xc7..=0xc9 => {
                let n = self.len(1 << (m - 0xc7))?;
                self.take(n.checked_add(1)?)?;
                Some(Item::Opaque)
            }
            0xca => s(float(f64::from(f32::from_be_bytes(self.be()?)))),
            0xcb => s(float(f64::from_be_bytes(self.be()?))),
            0xcc => s(Scalar::Int(i128::from(self.u8()?))),
            0xcd => s(Scalar::Int(i128::from(u16::from_be_bytes(self.be()?)))),
            0xce => s(Scalar::Int(i128::from(u32::from_be_bytes(self.be()?)))),
            0xcf => s(Scalar::Int(i128::from(u64::from_be_bytes(self.be()?)))),
            0xd0 => s(Scalar::Int(i128::from(i8::from_be_bytes(self.be()?)))),
            0xd1 => s(Scalar::Int(i128::from(i16::from_be_bytes(self.be()?)))),
            0xd2 => s(Scalar::Int(i128::from(i32::from_be_bytes(self.be()?)))),
            0xd3 => s(Scalar::Int(i128::from(i64::from_be_bytes(self.be()?)))),
            0xd4..=0xd8 => {
                self.take((1usize << (m - 0xd4)) + 1)?;
                Some(Item::Opaque)
            }
            0xd9..=0xdb => {
                let n = self.len(1 << (m - 0xd9))?;
                s(Scalar::Str(self.take(n)?))
            }
            0xdc => Some(Item::Array(self.len(2)?)),
            0xdd => Some(Item::Array(self.len(4)?)),
            0xde => Some(Item::Map(self.len(2)?)),
            0xdf => Some(Item::Map(self.len(4)?)),
            0xc1 => None,
            0xe0..=0xff => s(Scalar::Int(i128::from(m.cast_signed()))),
        }
    }

    /// Skips one whole value, iteratively (no recursion on hostile nesting).
    pub(crate) fn skip(&mut self) -> Option<()> {
        let mut left: usize = 1;
        while left > 0 {
            left -= 1;
            match self.item()? {
                Item::Scalar(_) | Item::Opaque => {}
                // Every element takes at least a byte: a count beyond the
                // remaining bytes is malformed.
                Item::Array(n) => left = left.checked_add(n).filter(|&l| l <= self.b.len() - self.pos)?,
                Item::Map(n) => {
                    left = left.checked_add(n.checked_mul(2)?).filter(|&l| l <= self.b.len() - self.pos)?;
                }
            }
        }
        Some(())
    }

    /// Reads the value here: a scalar, or `Other` for an array/object (skipped).
    pub(crate) fn scalar(&mut self) -> Option<Scalar<'a>> {
        let start = *self;
        match self.item()? {
            Item::Scalar(s) => Some(s),
            Item::Array(_) | Item::Map(_) => {
                *self = start;
                self.skip()?;
                Some(Scalar::Other)
            }
            // serde_json can't hold bin/ext: the record would not decode.
            Item::Opaque => None,
        }
    }

    /// Descends along `path` from the value here; leaves the reader at the
    /// found value.
    pub(crate) fn descend<'p>(&mut self, path: impl IntoIterator<Item = &'p str>) -> Option<()> {
        for seg in path {
            let here = *self;
            match self.item()? {
                Item::Map(n) => {
                    let mut found = None;
                    for _ in 0..n {
                        let key = match self.item()? {
                            Item::Scalar(Scalar::Str(k)) => Some(k),
                            _ => None,
                        };
                        if key == Some(seg.as_bytes()) {
                            found = Some(*self);
                        }
                        self.skip()?;
                    }
                    *self = found?;
                }
                Item::Array(n) => {
                    let i: usize = seg.parse().ok()?;
                    if i >= n {
                        return None;
                    }
                    for _ in 0..i {
                        self.skip()?;
                    }
                }
                _ => {
                    *self = here;
                    return None;
                }
            }
        }
        Some(())
    }
}

/// Whether `s` is UTF-8: an ASCII string (the usual case: keys, ids,
/// types) is checked a word at a time, inline, before the full check.
#[inline]
pub(crate) fn is_utf8(s: &[u8]) -> bool {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let (words, tail) = s.as_chunks::<8>();
    let high = words.iter().fold(0, |acc, w| acc | u64::from_ne_bytes(*w)) & HIGH;
    (high == 0 && tail.iter().all(u8::is_ascii)) || std::str::from_utf8(s).is_ok()
}

/// Whether the MessagePack value `b` reads as JSON: what
/// `walk_json(b, max_depth, None).is_some()` answers, without its writer's
/// bookkeeping (a read checks every document it returns: this is on the
/// read path of every event).
pub(crate) fn is_json(b: &[u8], max_depth: usize) -> bool {
    /// An open array or map: values still to walk (a map's keys and values
    /// counted apart, so a key is walked when an even number is left).
    struct Open {
        left: usize,
        map: bool,
    }
    let mut r = Reader::new(b);
    let mut stack: smallvec::SmallVec<[Open; 16]> = smallvec::SmallVec::new();
    let mut cur = Open { left: 1, map: false };
    loop {
        if cur.left == 0 {
            match stack.pop() {
                Some(up) => {
                    cur = up;
                    continue;
                }
                None => return r.pos() == b.len(),
            }
        }
        let is_key = cur.map && cur.left.is_multiple_of(2);
        cur.left -= 1;
        // The usual markers first, inline: short strings, small integers,
        // null and booleans.
        match b.get(r.pos) {
            Some(&m @ 0xa0..=0xbf) => {
                let start = r.pos + 1;
                let end = start + usize::from(m & 0x1f);
                match b.get(start..end) {
                    Some(s) if is_utf8(s) => {
                        r.pos = end;
                        continue;
                    }
                    _ => return false,
                }
            }
            Some(0x00..=0x7f | 0xc0 | 0xc2 | 0xc3 | 0xe0..=0xff) if !is_key => {
                r.pos += 1;
                continue;
            }
            _ => {}
        }
        match r.item() {
            Some(Item::Scalar(Scalar::Str(s))) => {
                if !is_utf8(s) {
                    return false;
                }
            }
            Some(Item::Scalar(Scalar::Other) | Item::Opaque) | None => return false,
            Some(Item::Scalar(_)) => {
                if is_key {
                    return false;
                }
            }
            Some(Item::Array(n) | Item::Map(n)) if is_key || stack.len() + 1 > max_depth || n > b.len() - r.pos() => {
                return false;
            }
            Some(Item::Array(n)) => stack.push(std::mem::replace(&mut cur, Open { left: n, map: false })),
            Some(Item::Map(n)) => {
                let Some(n2) = n.checked_mul(2).filter(|&m| m <= b.len() - r.pos()) else { return false };
                stack.push(std::mem::replace(&mut cur, Open { left: n2, map: true }));
            }
        }
    }
}

fn float(f: f64) -> Scalar<'static> {
    if f.is_finite() { Scalar::Float(f) } else { Scalar::Null }
}

/// Walks the MessagePack value `b` as JSON: `Some` when it is exactly one
/// value that reads as JSON (string map keys, UTF-8 strings, no byte
/// strings or extensions, at most `max_depth` levels of arrays and maps),
/// writing its JSON text to `out` when given: what `serde_json::to_writer`
/// writes for the value decoded into a `Value` (keys in their stored order,
/// a 32-bit float widened to 64 bits, a non-finite float as `null`),
/// without building the `Value`. On `None`, `out` may hold part of it.
/// Iterative: hostile nesting can't exhaust the stack.
pub(crate) fn walk_json(b: &[u8], max_depth: usize, mut out: Option<&mut Vec<u8>>) -> Option<()> {
    struct Frame {
        /// Values (keys and values, in a map) still to walk.
        left: usize,
        /// Values walked so far.
        done: usize,
        map: bool,
    }
    // Writes to `out`, when there is one.
    macro_rules! put {
        ($o:ident => $write:expr) => {
            if let Some($o) = out.as_deref_mut() {
                $write;
            }
        };
    }
    let mut r = Reader::new(b);
    // The root is a frame of one value, without brackets.
    // Inline for the usual few levels: a check allocates nothing.
    let mut stack: smallvec::SmallVec<[Frame; 16]> = smallvec::smallvec![Frame { left: 1, done: 0, map: false }];
    while let Some(top) = stack.last_mut() {
        if top.left == 0 {
            let map = top.map;
            stack.pop();
            if !stack.is_empty() {
                put!(o => o.push(if map { b'}' } else { b']' }));
            }
            continue;
        }
        let (i, map) = (top.done, top.map);
        top.left -= 1;
        top.done += 1;
        let is_key = map && i % 2 == 0;
        if stack.len() > 1 && i > 0 {
            put!(o => o.push(if map && !is_key { b':' } else { b',' }));
        }
        match r.item()? {
            Item::Scalar(Scalar::Str(s)) => {
                if !is_utf8(s) {
                    return None;
                }
                // Checked just above.
                put!(o => serde_json::to_writer(&mut *o, std::str::from_utf8(s).ok()?).ok()?);
            }
            Item::Scalar(_) if is_key => return None,
            Item::Scalar(Scalar::Null) => put!(o => o.extend_from_slice(b"null")),
            Item::Scalar(Scalar::Bool(v)) => put!(o => o.extend_from_slice(if v { b"true" } else { b"false" })),
            Item::Scalar(Scalar::Int(v)) => put!(o => std::io::Write::write_fmt(o, format_args!("{v}")).ok()?),
            Item::Scalar(Scalar::Float(v)) => put!(o => serde_json::to_writer(&mut *o, &v).ok()?),
            Item::Scalar(Scalar::Other) | Item::Opaque => return None,
            Item::Array(_) | Item::Map(_) if is_key || stack.len() > max_depth => return None,
            Item::Array(n) => {
                // Every element takes at least a byte.
                if n > b.len() - r.pos() {
                    return None;
                }
                put!(o => o.push(b'['));
                stack.push(Frame { left: n, done: 0, map: false });
            }
            Item::Map(n) => {
                let n2 = n.checked_mul(2).filter(|&m| m <= b.len() - r.pos())?;
                put!(o => o.push(b'{'));
                stack.push(Frame { left: n2, done: 0, map: true });
            }
        }
    }
    (r.pos() == b.len()).then_some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Bytes drawn mostly from markers that open and fill small arrays and
    /// maps, so that many inputs are whole values, some nested deep, some
    /// with a non-string key, bad UTF-8, bin/ext or trailing bytes.
    fn msgpackish() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![
            Just(0x81u8),
            Just(0x82),
            Just(0x91),
            Just(0x92),
            Just(0x90),
            Just(0x80),
            Just(0xa1),
            Just(0xa2),
            Just(0x61),
            Just(0xc3),
            Just(0xc0),
            Just(0x07),
            Just(0xff),
            Just(0xc4),
            Just(0xd4),
            Just(0xcb),
            Just(0xdc),
            Just(0xde),
            Just(0x00),
            any::<u8>(),
        ];
        proptest::collection::vec(byte, 0..48)
    }

    proptest! {
        /// The read path's check answers what the writer's walk answers,
        /// at every depth limit around the input's nesting.
        #[test]
        fn is_json_agrees_with_walk_json(b in msgpackish(), depth in 0usize..6) {
            prop_assert_eq!(is_json(&b, depth), walk_json(&b, depth, None).is_some(), "{:02x?}", b);
        }
    }

    proptest! {
        /// The word-at-a-time check answers what `std::str::from_utf8` does.
        #[test]
        fn is_utf8_agrees_with_std(s in proptest::collection::vec(prop_oneof![0x20u8..0x7f, any::<u8>()], 0..40)) {
            prop_assert_eq!(is_utf8(&s), std::str::from_utf8(&s).is_ok());
        }
    }

    #[test]
    fn is_utf8_finds_a_bad_byte_anywhere() {
        for at in 0..20 {
            let mut s = vec![b'x'; 19];
            s.insert(at, 0xff);
            assert!(!is_utf8(&s), "0xff at {at}");
            let good = format!("{}é{}", "a".repeat(at), "b".repeat(19 - at));
            assert!(is_utf8(good.as_bytes()), "é at {at}");
        }
    }

    #[test]
    fn is_json_takes_json_values_and_refuses_what_json_cannot_hold() {
        let ok =
            rmp_serde::to_vec_named(&serde_json::json!({"a": [1, "é", null, {"b": 2.5}], "c": true})).expect("encode");
        assert!(is_json(&ok, 8));
        assert!(!is_json(&ok, 2), "three levels deep, two allowed");
        assert!(is_json(&ok, 3));
        let mut trailing = ok.clone();
        trailing.push(0xc0);
        assert!(!is_json(&trailing, 8), "two values");
        assert!(!is_json(&[0x81, 0x01, 0x02], 8), "an integer key");
        assert!(!is_json(&[0xa2, 0xc3, 0x28], 8), "not UTF-8");
        assert!(!is_json(&[0xc4, 0x01, 0x00], 8), "a byte string");
        assert!(!is_json(&[0x92, 0x01], 8), "an array missing an element");
        assert!(!is_json(&[], 8), "nothing");
    }
}
