//! An event's document as appended ([`Payload`]), kept in its stored
//! encoding and decoded only when asked, and the canonical JSON form its
//! maps serialize in.

use std::sync::OnceLock;

use bytes::Bytes;

use super::text::{Text, shared_copy};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::msgpack::{Item, Reader, Scalar};

/// A JSON object: the type of event metadata.
pub type Metadata = Map<String, Value>;

/// True when `serde_json::Map` keeps its keys sorted (its default). A
/// dependency may turn on its `preserve_order` feature for the whole build
/// (bson does, so the `mongo` feature does): maps then keep insertion
/// order, and the encoders below sort them themselves.
fn maps_are_sorted() -> bool {
    static SORTED: OnceLock<bool> = OnceLock::new();
    *SORTED.get_or_init(|| {
        let mut m = Map::new();
        m.insert("b".to_owned(), Value::Null);
        m.insert("a".to_owned(), Value::Null);
        m.keys().next().is_some_and(|k| k == "a")
    })
}

/// A JSON value serialized in its canonical form, object keys sorted
/// (format/README.md), whatever serde_json's features: byte for byte what
/// `Value`'s own `Serialize` writes when its maps are sorted.
pub(crate) struct Sorted<'a>(pub &'a Value);

impl Serialize for Sorted<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        match self.0 {
            Value::Object(m) => SortedMap(m).serialize(s),
            Value::Array(a) => {
                let mut seq = s.serialize_seq(Some(a.len()))?;
                for v in a {
                    seq.serialize_element(&Sorted(v))?;
                }
                seq.end()
            }
            other => other.serialize(s),
        }
    }
}

/// A JSON object serialized with its keys sorted (see [`Sorted`]).
pub(crate) struct SortedMap<'a>(pub &'a Map<String, Value>);

impl Serialize for SortedMap<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        if self.0.keys().is_sorted() {
            for (k, v) in self.0 {
                map.serialize_entry(k, &Sorted(v))?;
            }
        } else {
            let mut entries: Vec<(&String, &Value)> = self.0.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            for (k, v) in entries {
                map.serialize_entry(k, &Sorted(v))?;
            }
        }
        map.end()
    }
}

/// How a [`Payload`]'s bytes are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PayloadFormat {
    /// MessagePack, maps keyed by strings (how the native and memory
    /// backends store payloads).
    MessagePack,
    /// JSON text.
    Json,
}

/// An event's document as it was appended, kept in its stored encoding.
///
/// [`Payload::decode`] reads it straight into the caller's type, with no
/// JSON value in between; [`Payload::json`] decodes it once into a
/// [`serde_json::Value`] for ad-hoc access and keeps it; [`Payload::bytes`]
/// gives the encoded bytes. Cloning shares the bytes. It serializes as the
/// JSON document it holds.
///
/// ```
/// use rheo::Payload;
/// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
/// struct Paid { amount: u64 }
/// let p = Payload::encode(&Paid { amount: 5 })?;
/// assert_eq!(p.decode::<Paid>()?, Paid { amount: 5 });
/// assert_eq!(p.json()?["amount"], 5);
/// # Ok::<(), rheo::Error>(())
/// ```
#[derive(Clone)]
pub struct Payload {
    bytes: Bytes,
    format: PayloadFormat,
    /// Whether the bytes are known to read as JSON (see `json_compatible`).
    checked: bool,
    json: OnceLock<Value>,
}

impl Payload {
    /// Encodes a value as MessagePack, once. A value that MessagePack would
    /// hold in a way JSON can't (byte strings, maps keyed by numbers) is
    /// encoded as its JSON form instead, so that every payload reads back as
    /// a JSON document. `Error::Payload` when it can't be serialized.
    pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Payload> {
        let fail = |reason: String| Error::Payload { context: "encoding a payload".to_owned(), reason };
        // Encoded into this thread's scratch buffer, then copied once into
        // this thread's shared chunk (`shared_copy`): no allocation of its
        // own unless it is large. (A `Serialize` that encodes a payload
        // itself gets a scratch buffer of its own.)
        let encode_into = |buf: &mut Vec<u8>| -> Result<Bytes> {
            buf.clear();
            // A JSON value or map writes its keys in its own order, which is
            // insertion order when serde_json keeps it: through `Sorted` then.
            let json = [std::any::type_name::<Value>(), std::any::type_name::<Map<String, Value>>()];
            let unsorted_json = !maps_are_sorted() && json.contains(&std::any::type_name::<T>());
            let direct =
                !unsorted_json && rmp_serde::encode::write_named(&mut *buf, value).is_ok() && json_compatible(buf);
            if !direct {
                let v = serde_json::to_value(value).map_err(|e| fail(e.to_string()))?;
                buf.clear();
                rmp_serde::encode::write_named(&mut *buf, &Sorted(&v)).map_err(|e| fail(e.to_string()))?;
                if !json_compatible(buf) {
                    return Err(fail(format!("nested deeper than {MAX_PAYLOAD_DEPTH} levels of arrays and objects")));
                }
            }
            Ok(shared_copy(buf))
        };
        let bytes = SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut buf) => {
                let out = encode_into(&mut buf);
                // A huge payload's buffer is not kept for the next one.
                if buf.capacity() > SCRATCH_KEEP {
                    *buf = Vec::new();
                }
                out
            }
            Err(_) => encode_into(&mut Vec::new()),
        })?;
        Ok(Payload::from_checked_msgpack(bytes))
    }

    /// A payload of JSON text (e.g. a line a pass-through producer read).
    /// `Error::Payload` when it is not one JSON value.
    pub fn from_json(text: impl Into<Bytes>) -> Result<Payload> {
        let bytes = text.into();
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Payload { context: "reading a JSON payload".to_owned(), reason: e.to_string() })?;
        let p = Payload { bytes, format: PayloadFormat::Json, checked: true, json: OnceLock::new() };
        let _ = p.json.set(v);
        Ok(p)
    }

    /// A JSON payload read back from a database. Its nesting is checked
    /// first (at most [`MAX_PAYLOAD_DEPTH`], what an append accepts, so a
    /// document written by another program can't exhaust the stack); then
    /// it is parsed without serde_json's own limit, which is lower.
    #[allow(dead_code)]
    pub(crate) fn from_stored_json(text: impl Into<Bytes>) -> Result<Payload> {
        let bytes = text.into();
        let fail = |reason: String| Error::Payload { context: "reading a stored JSON payload".to_owned(), reason };
        let (mut depth, mut max, mut in_str, mut escaped) = (0usize, 0usize, false, false);
        for &b in bytes.iter() {
            if in_str {
                match (escaped, b) {
                    (true, _) => escaped = false,
                    (false, b'\\') => escaped = true,
                    (false, b'"') => in_str = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_str = true,
                b'[' | b'{' => {
                    depth += 1;
                    max = max.max(depth);
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        if max > MAX_PAYLOAD_DEPTH {
            return Err(fail(format!("nested deeper than {MAX_PAYLOAD_DEPTH} levels of arrays and objects")));
        }
        // Checked to be one JSON value without building it (a fetch hands
        // out many payloads its consumer may never look into); `json()`
        // builds the value on first use.
        let mut de = serde_json::Deserializer::from_slice(&bytes);
        de.disable_recursion_limit();
        serde::de::IgnoredAny::deserialize(&mut de).map_err(|e| fail(e.to_string()))?;
        de.end().map_err(|e| fail(e.to_string()))?;
        Ok(Payload { bytes, format: PayloadFormat::Json, checked: true, json: OnceLock::new() })
    }

    /// A payload of MessagePack bytes. `Error::Payload` when they are not
    /// exactly one value that reads as JSON (string map keys, no byte
    /// strings or extensions).
    pub fn from_msgpack(bytes: impl Into<Bytes>) -> Result<Payload> {
        let bytes = bytes.into();
        if !json_compatible(&bytes) {
            return Err(Error::Payload {
                context: "reading a MessagePack payload".to_owned(),
                reason: "not exactly one JSON-compatible MessagePack value".to_owned(),
            });
        }
        Ok(Payload::from_checked_msgpack(bytes))
    }

    /// MessagePack bytes the caller checked with `json_compatible`.
    pub(crate) fn from_checked_msgpack(bytes: Bytes) -> Payload {
        Payload { bytes, format: PayloadFormat::MessagePack, checked: true, json: OnceLock::new() }
    }

    /// `Error::Payload` unless the payload reads back as JSON (what an
    /// append stores must).
    pub(crate) fn check(&self) -> Result<()> {
        if self.checked || json_compatible(&self.bytes) {
            return Ok(());
        }
        Err(Error::Payload {
            context: "appending a payload".to_owned(),
            reason: format!("nested deeper than {MAX_PAYLOAD_DEPTH} levels of arrays and objects"),
        })
    }

    /// A payload holding a JSON value (encoded as MessagePack). Appending
    /// one nested deeper than [`MAX_PAYLOAD_DEPTH`] fails; use
    /// [`Payload::encode`] to be told at once.
    pub fn from_value(value: &Value) -> Payload {
        let mut buf = Vec::with_capacity(128);
        // A JSON value always encodes: string keys, no byte strings.
        let _ = rmp_serde::encode::write_named(&mut buf, &Sorted(value));
        Payload { bytes: Bytes::from(buf), format: PayloadFormat::MessagePack, checked: false, json: OnceLock::new() }
    }

    /// Decodes the payload into `T`, straight from its stored encoding.
    ///
    /// ```
    /// # use rheo::Payload;
    /// #[derive(serde::Deserialize)]
    /// struct Paid { amount: u64 }
    /// let p = Payload::from_json(r#"{"amount": 5, "currency": "EUR"}"#)?;
    /// assert_eq!(p.decode::<Paid>()?.amount, 5);
    /// # Ok::<(), rheo::Error>(())
    /// ```
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T> {
        let r = match self.format {
            PayloadFormat::MessagePack => rmp_serde::from_slice(&self.bytes).map_err(|e| e.to_string()),
            PayloadFormat::Json => {
                // A checked payload nests at most MAX_PAYLOAD_DEPTH deep,
                // which serde_json's own limit (128) would refuse at the top.
                let mut de = serde_json::Deserializer::from_slice(&self.bytes);
                if self.checked {
                    de.disable_recursion_limit();
                }
                T::deserialize(&mut de).and_then(|v| de.end().map(|()| v)).map_err(|e| e.to_string())
            }
        };
        r.map_err(|reason| Error::Payload { context: "decoding a payload".to_owned(), reason })
    }

    /// The payload as a JSON value, decoded on first use and kept.
    pub fn json(&self) -> Result<&Value> {
        if let Some(v) = self.json.get() {
            return Ok(v);
        }
        let v: Value = self.decode()?;
        Ok(self.json.get_or_init(|| v))
    }

    /// Writes the payload as JSON text to `out`: the same text as
    /// `serde_json::to_writer(out, self.json()?)`, but a MessagePack
    /// payload not decoded yet is transcoded straight from its bytes,
    /// without building (and dropping) a `Value` (the SQL backends write
    /// every appended payload so). On an error `out` is as it was.
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    pub(crate) fn write_json(&self, out: &mut Vec<u8>) -> Result<()> {
        let start = out.len();
        let done = match (self.json.get(), self.format) {
            (None, PayloadFormat::MessagePack) => {
                crate::msgpack::walk_json(&self.bytes, MAX_PAYLOAD_DEPTH, Some(&mut *out)).ok_or_else(|| {
                    Error::Payload {
                        context: "writing a payload as JSON".to_owned(),
                        reason: format!(
                            "not one JSON-compatible MessagePack value nested at most {MAX_PAYLOAD_DEPTH} levels deep"
                        ),
                    }
                })
            }
            _ => serde_json::to_writer(&mut *out, self.json()?)
                .map_err(|e| Error::Payload { context: "writing a payload as JSON".to_owned(), reason: e.to_string() }),
        };
        if done.is_err() {
            out.truncate(start);
        }
        done
    }

    /// The encoded bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The encoded bytes, shared.
    pub fn bytes(&self) -> Bytes {
        self.bytes.clone()
    }

    /// How the bytes are encoded.
    pub fn format(&self) -> PayloadFormat {
        self.format
    }

    /// The MessagePack encoding of the payload (borrowed when it is stored so).
    pub(crate) fn to_msgpack(&self) -> Result<std::borrow::Cow<'_, [u8]>> {
        match self.format {
            PayloadFormat::MessagePack => Ok(std::borrow::Cow::Borrowed(&self.bytes)),
            PayloadFormat::Json => Ok(std::borrow::Cow::Owned(Payload::from_value(self.json()?).bytes.into())),
        }
    }

    /// The value at a dotted path inside the payload (objects by key, the
    /// last duplicate winning; arrays by index), as `Event::field` reads
    /// it. Unless the whole payload was already decoded, only the value at
    /// the path is: the path is walked in the stored bytes, so a query that
    /// tests a field of each record decodes that field, not the record.
    pub(crate) fn field(&self, path: &str) -> Option<Value> {
        if self.format == PayloadFormat::Json || self.json.get().is_some() {
            return lookup(self.json().ok()?, path).cloned();
        }
        let mut r = Reader::new(&self.bytes);
        r.descend(path.split('.'))?;
        let start = r.pos();
        r.skip()?;
        rmp_serde::from_slice(self.bytes.get(start..r.pos())?).ok()
    }

    /// The top-level `type` and `key` strings and `metadata` object, when
    /// the payload is an object: what an append reads from it. A stored
    /// payload's map is walked once for the three (the last duplicate of a
    /// key winning, as [`Event::field`](crate::Event::field) reads it).
    pub(super) fn top_fields(&self) -> TopFields {
        // The strings share the payload's bytes.
        let text = |s: &[u8]| Text::checked(self.bytes.slice_ref(s));
        match self.format {
            PayloadFormat::MessagePack => {
                let mut r = Reader::new(&self.bytes);
                let Some(Item::Map(n)) = r.item() else { return TopFields::default() };
                let (mut event_type, mut key, mut metadata) = (None, None, None);
                for _ in 0..n {
                    let name = match r.item() {
                        Some(Item::Scalar(Scalar::Str(k))) => Some(k),
                        Some(_) => None,
                        None => return TopFields::default(),
                    };
                    let at = r;
                    match name {
                        Some(b"type") => event_type = Some(at),
                        Some(b"key") => key = Some(at),
                        Some(b"metadata") => metadata = Some(at),
                        _ => {}
                    }
                    if r.skip().is_none() {
                        return TopFields::default();
                    }
                }
                let string = |at: Option<Reader<'_>>| match at?.scalar()? {
                    Scalar::Str(s) => text(s),
                    _ => None,
                };
                let object = |at: Option<Reader<'_>>| {
                    let mut r = at?;
                    let (start, mut probe) = (r.pos(), r);
                    if !matches!(probe.item()?, Item::Map(_)) {
                        return None;
                    }
                    r.skip()?;
                    rmp_serde::from_slice(self.bytes.get(start..r.pos())?).ok()
                };
                TopFields { event_type: string(event_type), key: string(key), metadata: object(metadata) }
            }
            PayloadFormat::Json => {
                let Some(map) = self.json().ok().and_then(Value::as_object) else { return TopFields::default() };
                let string = |name: &str| map.get(name)?.as_str().map(Text::copied);
                TopFields {
                    event_type: string("type"),
                    key: string("key"),
                    metadata: map.get("metadata").and_then(Value::as_object).cloned(),
                }
            }
        }
    }
}

/// What an append reads from the top of a payload ([`Payload::top_fields`]).
#[derive(Debug, Default, PartialEq)]
pub(super) struct TopFields {
    /// The string at `type`.
    pub(super) event_type: Option<Text>,
    /// The string at `key`.
    pub(super) key: Option<Text>,
    /// The object at `metadata`.
    pub(super) metadata: Option<Metadata>,
}

impl From<Value> for Payload {
    fn from(v: Value) -> Payload {
        let p = Payload::from_value(&v);
        let _ = p.json.set(v);
        p
    }
}

impl From<&Value> for Payload {
    fn from(v: &Value) -> Payload {
        Payload::from_value(v)
    }
}

/// The deepest nesting of arrays and maps a payload may have: serde_json's
/// own limit when it parses text, and shallow enough that decoding a payload
/// into a `Value` (recursive) fits any thread's stack. Appends refuse
/// deeper payloads.
pub const MAX_PAYLOAD_DEPTH: usize = 128;

thread_local! {
    /// Where [`Payload::encode`] encodes before copying out.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The largest scratch buffer a thread keeps between payloads.
const SCRATCH_KEEP: usize = 64 * 1024;

/// Whether `b` is exactly one MessagePack value that reads as JSON: map
/// keys are strings, strings are UTF-8, no byte strings or extensions, at
/// most [`MAX_PAYLOAD_DEPTH`] levels of nesting.
pub(crate) fn json_compatible(b: &[u8]) -> bool {
    crate::msgpack::is_json(b, MAX_PAYLOAD_DEPTH)
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        if self.format == other.format && self.bytes == other.bytes {
            return true;
        }
        matches!((self.json(), other.json()), (Ok(a), Ok(b)) if a == b)
    }
}

/// A payload equals a JSON value when it decodes to it.
impl PartialEq<Value> for Payload {
    fn eq(&self, other: &Value) -> bool {
        self.json().is_ok_and(|v| v == other)
    }
}

impl PartialEq<Value> for &Payload {
    fn eq(&self, other: &Value) -> bool {
        (*self).eq(other)
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.json() {
            Ok(v) => write!(f, "Payload({v})"),
            Err(_) => write!(f, "Payload({:?}, {} undecodable bytes)", self.format, self.bytes.len()),
        }
    }
}

/// The JSON text of the payload (`<undecodable payload: N bytes>` when it
/// does not decode).
impl std::fmt::Display for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.json() {
            Ok(v) => write!(f, "{v}"),
            Err(_) => write!(f, "<undecodable payload: {} bytes>", self.bytes.len()),
        }
    }
}

impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        self.json().map_err(serde::ser::Error::custom)?.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        Ok(Payload::from_value(&Value::deserialize(d)?))
    }
}

/// The value at a dotted path (object keys, array indexes) in `value`.
pub(super) fn lookup<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(value, |v, part| match v {
        Value::Object(m) => m.get(part),
        Value::Array(a) => part.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// One walk reads what three lookups by path read, from stored
    /// MessagePack and from JSON text alike, duplicates included.
    #[test]
    fn top_fields_read_type_key_and_metadata_as_field_lookups_do() {
        let cases = [
            json!({"type": "paid", "key": "k1", "metadata": {"a": 1}, "n": 5}),
            json!({"n": [1, 2], "type": 7, "key": null, "metadata": "not a map"}),
            json!({"metadata": {"nested": {"x": [1, {"y": 2}]}}, "type": "t"}),
            json!([{"type": "inside an array"}]),
            json!("a string"),
            json!({}),
        ];
        let expected = |v: &Value| TopFields {
            event_type: v.get("type").and_then(Value::as_str).map(Text::copied),
            key: v.get("key").and_then(Value::as_str).map(Text::copied),
            metadata: v.get("metadata").and_then(Value::as_object).cloned(),
        };
        for v in &cases {
            assert_eq!(Payload::from_value(v).top_fields(), expected(v), "{v}");
            let text = Payload::from_json(v.to_string()).expect("json");
            assert_eq!(text.top_fields(), expected(v), "{v} as JSON text");
        }
        // A key given twice: the last one counts, as in a JSON object.
        let mut buf = vec![0x83]; // a map of three (fixmap), short strings (fixstr)
        for s in ["type", "first", "key", "k", "type", "last"] {
            buf.push(0xa0 | u8::try_from(s.len()).expect("short"));
            buf.extend_from_slice(s.as_bytes());
        }
        let p = Payload::from_msgpack(buf).expect("msgpack");
        assert_eq!(p.top_fields().event_type.as_deref(), Some("last"));
        assert_eq!(p.field("type"), Some(json!("last")), "the same value a path lookup reads");
    }

    /// Maps are written with sorted keys whatever order they were built
    /// in, with or without serde_json's `preserve_order` (the `mongo`
    /// feature turns it on; .ci/run runs this under it).
    #[test]
    fn json_maps_encode_with_sorted_keys_in_every_build() {
        let mut inner = Map::new();
        inner.insert("z".to_owned(), json!(1));
        inner.insert("m".to_owned(), json!([{"y": 1, "b": 2}]));
        let mut m = Map::new();
        m.insert("b".to_owned(), Value::Object(inner));
        m.insert("a".to_owned(), json!("x"));
        let v = Value::Object(m.clone());
        let sorted: std::collections::BTreeMap<&str, serde_json::Value> =
            [("a", json!("x")), ("b", json!({"m": [{"b": 2, "y": 1}], "z": 1}))].into_iter().collect();
        // The canonical bytes, written without serde_json's maps.
        let mut want = vec![0x82, 0xa1, b'a', 0xa1, b'x', 0xa1, b'b', 0x82, 0xa1, b'm', 0x91, 0x82];
        want.extend([0xa1, b'b', 0x02, 0xa1, b'y', 0x01, 0xa1, b'z', 0x01]);
        assert_eq!(rmp_serde::to_vec_named(&sorted).expect("encode"), want, "the expected bytes are canonical");
        assert_eq!(&Payload::from_value(&v).bytes()[..], &want[..]);
        assert_eq!(&Payload::encode(&v).expect("encode").bytes()[..], &want[..]);
        assert_eq!(&Payload::encode(&m).expect("encode").bytes()[..], &want[..]);
        let mut meta = Vec::new();
        rmp_serde::encode::write_named(&mut meta, &SortedMap(&m)).expect("metadata");
        assert_eq!(meta, want);
    }

    /// A payload not decoded yet: `write_json` must transcode its bytes.
    fn fresh(p: &Payload) -> Payload {
        Payload::from_msgpack(p.bytes()).expect("stored bytes")
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            any::<f32>().prop_map(|f| Value::from(f64::from(f))),
            ".{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(6, 64, 8, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                proptest::collection::btree_map(".{0,8}", inner, 0..8)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        /// The transcoder writes exactly what serde_json writes for the
        /// decoded value (the text the SQL backends stored before it).
        #[test]
        fn write_json_matches_the_decoded_value(v in json_value()) {
            let p = fresh(&Payload::from_value(&v));
            let want = serde_json::to_vec(p.json().expect("decodes")).expect("writes");
            let mut got = b"prefix".to_vec();
            fresh(&p).write_json(&mut got).expect("transcodes");
            proptest::prop_assert_eq!(&got[6..], &want[..]);
        }
    }

    #[test]
    fn write_json_widens_f32_like_decoding_and_refuses_bad_bytes_untouched() {
        #[derive(Serialize)]
        struct R {
            f: f32,
            n: f64,
            i: i64,
            u: u64,
        }
        let p = Payload::encode(&R { f: 0.1, n: f64::NAN, i: i64::MIN, u: u64::MAX }).expect("encode");
        let mut got = Vec::new();
        fresh(&p).write_json(&mut got).expect("transcodes");
        // Fields in their stored order (serde_json's own map sorts them
        // unless its preserve_order feature is on), the value as decoded.
        let text = r#"{"f":0.10000000149011612,"n":null,"i":-9223372036854775808,"u":18446744073709551615}"#;
        assert_eq!(String::from_utf8_lossy(&got), text);
        assert_eq!(serde_json::from_slice::<Value>(&got).expect("json"), *p.json().expect("decodes"));
        // Malformed, a non-string key, a byte string, trailing bytes, and
        // nesting deeper than an append takes: refused, `out` untouched.
        let deep: Vec<u8> = std::iter::repeat_n(0x91u8, MAX_PAYLOAD_DEPTH + 1).chain([0xc0]).collect();
        for bad in [&[0x92, 0x01][..], &[0x81, 0x01, 0x02], &[0xc4, 0x01, 0x00], &[0x01, 0x02], &[0xc1], &deep] {
            let p = Payload {
                bytes: Bytes::copy_from_slice(bad),
                format: PayloadFormat::MessagePack,
                checked: true,
                json: OnceLock::new(),
            };
            let mut out = b"kept".to_vec();
            let e = p.write_json(&mut out).expect_err("refused");
            assert!(matches!(e, Error::Payload { .. }), "{e}");
            assert_eq!(out, b"kept", "out is as it was");
        }
        // Nested exactly as deep as an append takes: written.
        let ok: Vec<u8> = std::iter::repeat_n(0x91u8, MAX_PAYLOAD_DEPTH - 1).chain([0xc0]).collect();
        let p = Payload::from_msgpack(ok).expect("deep but allowed");
        let mut out = Vec::new();
        p.write_json(&mut out).expect("written");
        assert_eq!(out, serde_json::to_vec(p.json().expect("decodes")).expect("writes"));
    }
}
