//! Reads index terms straight from a record's MessagePack document
//! `[id, key, type, metadata, payload]`, without decoding it into JSON
//! values: the index builder's hot path.
//!
//! It resolves a path exactly as [`Event::field`](crate::Event::field) does
//! on the decoded event (objects by key, the last duplicate winning as in a
//! JSON map; arrays by index; non-finite floats as null). Bad input is never
//! a panic: a malformed document simply yields no value.

use super::term::Scalar;

/// A field of an index, split for extraction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldPath {
    /// The event id.
    Id,
    /// The key.
    Key,
    /// The type.
    Type,
    /// A path into the metadata (a lineage name is one segment).
    Metadata(Vec<String>),
    /// A path into the payload.
    Payload(Vec<String>),
    /// A path with an empty dotted segment: it names no value
    /// ([`crate::is_valid_path`]), as in `Event::field`.
    Nothing,
}

impl FieldPath {
    /// Splits a canonical field name (see [`super::term::canonical`]).
    pub fn parse(canonical: &str) -> FieldPath {
        if !crate::model::query::is_valid_path(canonical) {
            return FieldPath::Nothing;
        }
        let split = |s: &str| s.split('.').map(str::to_owned).collect();
        match canonical {
            "id" => FieldPath::Id,
            "key" => FieldPath::Key,
            "type" => FieldPath::Type,
            _ => {
                if let Some(rest) = canonical.strip_prefix("payload.") {
                    FieldPath::Payload(split(rest))
                } else {
                    FieldPath::Metadata(split(canonical.strip_prefix("metadata.").unwrap_or(canonical)))
                }
            }
        }
    }
}

/// Several fields read in one pass: the metadata and payload maps are each
/// walked once for all the fields under them, however many there are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extractor {
    fields: Vec<FieldPath>,
    /// Distinct first segments of the metadata paths, and of the payload's.
    meta_heads: Vec<String>,
    payload_heads: Vec<String>,
    /// Per field: index of its head in the list of its map (or unused).
    head_of: Vec<usize>,
}

impl Extractor {
    /// Plans the extraction of `fields`.
    pub fn new(fields: Vec<FieldPath>) -> Extractor {
        let mut meta_heads: Vec<String> = Vec::new();
        let mut payload_heads: Vec<String> = Vec::new();
        let mut head_of = Vec::with_capacity(fields.len());
        for f in &fields {
            let (heads, path) = match f {
                FieldPath::Metadata(p) => (&mut meta_heads, p),
                FieldPath::Payload(p) => (&mut payload_heads, p),
                _ => {
                    head_of.push(0);
                    continue;
                }
            };
            let head = path.first().cloned().unwrap_or_default();
            let i = heads.iter().position(|h| *h == head).unwrap_or_else(|| {
                heads.push(head);
                heads.len() - 1
            });
            head_of.push(i);
        }
        Extractor { fields, meta_heads, payload_heads, head_of }
    }

    /// The fields, in order.
    pub fn fields(&self) -> &[FieldPath] {
        &self.fields
    }

    /// Calls `f(i, value)` for each field `i` present in the document.
    pub fn extract<'a>(&self, doc: &DocParts<'a>, mut f: impl FnMut(usize, Scalar<'a>)) {
        let mut meta_at: Vec<Option<Reader<'a>>> = vec![None; self.meta_heads.len()];
        let mut payload_at: Vec<Option<Reader<'a>>> = vec![None; self.payload_heads.len()];
        if !self.meta_heads.is_empty() {
            map_heads(doc.parts[3], &self.meta_heads, &mut meta_at);
        }
        if !self.payload_heads.is_empty() {
            map_heads(doc.parts[4], &self.payload_heads, &mut payload_at);
        }
        // A payload may be any JSON value: one that is not an object (an
        // array, read by `0.sku`) has no keys to walk once; read on its own.
        let mut probe = doc.parts[4];
        let payload_is_map = matches!(probe.item(), Some(Item::Map(_)));
        for (i, field) in self.fields.iter().enumerate() {
            let v = match field {
                FieldPath::Id | FieldPath::Key | FieldPath::Type | FieldPath::Nothing => doc.get(field),
                FieldPath::Payload(_) if !payload_is_map => doc.get(field),
                FieldPath::Metadata(p) | FieldPath::Payload(p) => {
                    let at = if matches!(field, FieldPath::Metadata(_)) { &meta_at } else { &payload_at };
                    at[self.head_of[i]].and_then(|mut r| {
                        r.descend(&p[1..])?;
                        r.scalar()
                    })
                }
            };
            if let Some(v) = v {
                f(i, v);
            }
        }
    }
}

/// Walks the map at `r` once; records where the value of each wanted key
/// starts (the last duplicate wins, as in a JSON map).
fn map_heads<'a>(mut r: Reader<'a>, heads: &[String], at: &mut [Option<Reader<'a>>]) {
    let Some(Item::Map(n)) = r.item() else { return };
    for _ in 0..n {
        let key = match r.item() {
            Some(Item::Scalar(Scalar::Str(k))) => Some(k),
            Some(_) => None,
            None => return,
        };
        if let Some(k) = key
            && let Some(i) = heads.iter().position(|h| h.as_bytes() == k)
        {
            at[i] = Some(r);
        }
        if r.skip().is_none() {
            return;
        }
    }
}

/// A cursor over MessagePack bytes.
#[derive(Debug, Clone, Copy)]
struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

/// What a marker starts.
enum Item<'a> {
    Scalar(Scalar<'a>),
    Array(usize),
    Map(usize),
    /// A value with no JSON meaning (bin, ext): skipped, never indexed.
    Opaque,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.b.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }
    fn be<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N).and_then(|s| s.try_into().ok())
    }
    fn len(&mut self, bytes: usize) -> Option<usize> {
        let n = match bytes {
            1 => u64::from(self.u8()?),
            2 => u64::from(u16::from_be_bytes(self.be()?)),
            _ => u64::from(u32::from_be_bytes(self.be()?)),
        };
        usize::try_from(n).ok()
    }

    fn item(&mut self) -> Option<Item<'a>> {
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
    fn skip(&mut self) -> Option<()> {
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
    fn scalar(&mut self) -> Option<Scalar<'a>> {
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
    fn descend(&mut self, path: &[String]) -> Option<()> {
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

fn float(f: f64) -> Scalar<'static> {
    if f.is_finite() { Scalar::Float(f) } else { Scalar::Null }
}

/// A record document split into its five parts (positions of each).
#[derive(Debug, Clone, Copy)]
pub struct DocParts<'a> {
    parts: [Reader<'a>; 5],
}

impl<'a> DocParts<'a> {
    /// Splits a document; `None` when it is not an array of five values.
    pub fn split(doc: &'a [u8]) -> Option<DocParts<'a>> {
        let mut r = Reader { b: doc, pos: 0 };
        match r.item()? {
            Item::Array(5) => {}
            _ => return None,
        }
        let mut parts = [r; 5];
        // The payload is last: its end need not be found.
        for p in &mut parts[..4] {
            *p = r;
            r.skip()?;
        }
        parts[4] = r;
        Some(DocParts { parts })
    }

    /// The event id's bytes.
    pub fn id(&self) -> Option<&'a [u8]> {
        let mut r = self.parts[0];
        match r.scalar()? {
            Scalar::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value of a field, as [`Event::field`](crate::Event::field) would
    /// give it; `None` when absent.
    pub fn get(&self, field: &FieldPath) -> Option<Scalar<'a>> {
        let string_or_absent = |i: usize| {
            let mut r = self.parts[i];
            match r.scalar()? {
                s @ Scalar::Str(_) => Some(s),
                _ => None,
            }
        };
        match field {
            FieldPath::Id => string_or_absent(0),
            FieldPath::Key => string_or_absent(1),
            FieldPath::Type => string_or_absent(2),
            FieldPath::Metadata(path) => {
                let mut r = self.parts[3];
                let mut probe = r;
                if !matches!(probe.item()?, Item::Map(_)) {
                    return None;
                }
                r.descend(path)?;
                r.scalar()
            }
            FieldPath::Payload(path) => {
                let mut r = self.parts[4];
                r.descend(path)?;
                r.scalar()
            }
            FieldPath::Nothing => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::index::term::{canonical, json_key, scalar_key};
    use crate::engine::segment::record::DocRef;
    use crate::model::event::Metadata;
    use crate::model::event::{AppendOptions, NewEvent};
    use serde_json::json;

    fn key_of(s: Option<Scalar<'_>>) -> Option<Vec<u8>> {
        s.map(|s| {
            let mut k = Vec::new();
            scalar_key(&s, &mut k);
            k
        })
    }

    #[test]
    fn extraction_agrees_with_event_field() {
        let payload = json!({
            "currency": "EUR", "n": -3, "big": u64::MAX, "f": 2.5, "whole": 4.0, "t": true, "z": null,
            "order": {"customer_id": 42, "lines": [{"sku": "a"}, {"sku": "b"}]}, "arr": [1, 2], "": 7,
        });
        let opts = AppendOptions::new().key("k1").correlation_id("c-9").metadata("x", json!({"y": 1}));
        let mut e = NewEvent::prepare(payload, opts);
        e.event_type = Some("paid".into());
        let meta: &Metadata = &e.metadata;
        let doc = rmp_serde::to_vec(&DocRef(&e.id, e.key.as_deref(), e.event_type.as_deref(), meta, &e.payload))
            .expect("encode");
        let parts = DocParts::split(&doc).expect("split");
        let event = e.clone().into_event("s", 0, 1, crate::model::time::Timestamp::from_millis(0));
        let paths = [
            "id",
            "key",
            "type",
            "correlation_id",
            "producer",
            "metadata.x.y",
            "metadata.x",
            "metadata.nope",
            "currency",
            "n",
            "big",
            "f",
            "whole",
            "t",
            "z",
            "order.customer_id",
            "order.lines.1.sku",
            "order.lines.2.sku",
            "arr",
            "arr.0",
            "missing",
            "payload.",
            "order.customer_id.deeper",
        ];
        for p in paths {
            let c = canonical(p).expect("indexable");
            let got = key_of(parts.get(&FieldPath::parse(&c)));
            let want = event.field(p).map(|v| json_key(&v));
            assert_eq!(got, want, "path {p}");
        }
        assert_eq!(parts.id(), Some(e.id.as_bytes()));
        // One pass for all of them gives the same values.
        let canon: Vec<String> = paths.iter().map(|p| canonical(p).expect("indexable")).collect();
        let x = Extractor::new(canon.iter().map(|c| FieldPath::parse(c)).collect());
        let mut got: Vec<Option<Vec<u8>>> = vec![None; canon.len()];
        x.extract(&parts, |i, v| got[i] = key_of(Some(v)));
        for (i, c) in canon.iter().enumerate() {
            assert_eq!(got[i], key_of(parts.get(&FieldPath::parse(c))), "field {c}");
        }
    }

    #[test]
    fn malformed_documents_yield_nothing() {
        for doc in [&[][..], &[0x95], &[0x95, 0xc1], &[0x93, 1, 2, 3], &[0xdd, 0xff, 0xff, 0xff, 0xff]] {
            if let Some(p) = DocParts::split(doc) {
                let _ = p.get(&FieldPath::Payload(vec!["a".into()]));
            }
        }
    }
}
