//! Reads index terms straight from a record's MessagePack document
//! `[id, key, type, metadata, payload]`, without decoding it into JSON
//! values: the index builder's hot path.
//!
//! It resolves a path exactly as [`Event::field`](crate::Event::field) does
//! on the decoded event (objects by key, the last duplicate winning as in a
//! JSON map; arrays by index; non-finite floats as null). Bad input is never
//! a panic: a malformed document simply yields no value.

use crate::msgpack::{Item, Reader, Scalar};

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
        if !crate::model::path::is_valid_path(canonical) {
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
                        r.descend(p[1..].iter().map(String::as_str))?;
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

/// A record document split into its five parts (positions of each).
#[derive(Debug, Clone, Copy)]
pub struct DocParts<'a> {
    parts: [Reader<'a>; 5],
}

impl<'a> DocParts<'a> {
    /// Splits a document; `None` when it is not an array of five values.
    pub fn split(doc: &'a [u8]) -> Option<DocParts<'a>> {
        let mut r = Reader::new(doc);
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
                r.descend(path.iter().map(String::as_str))?;
                r.scalar()
            }
            FieldPath::Payload(path) => {
                let mut r = self.parts[4];
                r.descend(path.iter().map(String::as_str))?;
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
    use crate::model::append::{AppendOptions, NewEvent};
    use crate::model::payload::Metadata;
    use crate::model::payload::Payload;
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
        let mut e = NewEvent::prepare(Payload::from_value(&payload), opts);
        e.event_type = Some("paid".into());
        let meta: &Metadata = &e.metadata;
        let mut doc = Vec::new();
        DocRef(&e.id, e.key.as_deref(), e.event_type.as_deref(), meta, e.payload.as_bytes())
            .write(&mut doc)
            .expect("encode");
        let parts = DocParts::split(&doc).expect("split");
        let event =
            e.clone().into_event(&std::sync::Arc::from("s"), 0, 1, crate::model::time::Timestamp::from_millis(0));
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
