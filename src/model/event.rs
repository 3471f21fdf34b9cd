//! Events, their payloads, append options and lineage.
//!
//! An [`Event`] is a reference-counted view of one stored event: cloning it
//! (into a lease, a page, a dead letter, a handler) copies a pointer. Its
//! strings and payload share the bytes they were read from, and its payload
//! stays encoded until asked for ([`Payload::decode`], [`Payload::json`]).

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};

use super::time::Timestamp;
use crate::decode::DecodeError;
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
        let mut buf = Vec::with_capacity(128);
        // A JSON value or map writes its keys in its own order, which is
        // insertion order when serde_json keeps it: through `Sorted` then.
        let json = [std::any::type_name::<Value>(), std::any::type_name::<Map<String, Value>>()];
        let unsorted_json = !maps_are_sorted() && json.contains(&std::any::type_name::<T>());
        let direct = !unsorted_json && rmp_serde::encode::write_named(&mut buf, value).is_ok() && json_compatible(&buf);
        if !direct {
            let v = serde_json::to_value(value).map_err(|e| fail(e.to_string()))?;
            buf.clear();
            rmp_serde::encode::write_named(&mut buf, &Sorted(&v)).map_err(|e| fail(e.to_string()))?;
            if !json_compatible(&buf) {
                return Err(fail(format!("nested deeper than {MAX_PAYLOAD_DEPTH} levels of arrays and objects")));
            }
        }
        Ok(Payload::from_checked_msgpack(Bytes::from(buf)))
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

    /// The MessagePack encoding of the payload (shared when it is stored so).
    pub(crate) fn to_msgpack(&self) -> Result<Bytes> {
        match self.format {
            PayloadFormat::MessagePack => Ok(self.bytes.clone()),
            PayloadFormat::Json => Ok(Payload::from_value(self.json()?).bytes),
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

    /// The string value of a top-level field, when the payload is an object.
    fn top_str(&self, name: &str) -> Option<String> {
        match self.format {
            PayloadFormat::MessagePack => {
                let mut r = Reader::new(&self.bytes);
                r.descend([name])?;
                match r.scalar()? {
                    Scalar::Str(s) => std::str::from_utf8(s).ok().map(str::to_owned),
                    _ => None,
                }
            }
            PayloadFormat::Json => self.json().ok()?.get(name)?.as_str().map(str::to_owned),
        }
    }

    /// The top-level `metadata` object, when there is one.
    fn top_metadata(&self) -> Option<Metadata> {
        match self.format {
            PayloadFormat::MessagePack => {
                let mut r = Reader::new(&self.bytes);
                r.descend(["metadata"])?;
                let start = r.pos();
                let mut probe = r;
                if !matches!(probe.item()?, Item::Map(_)) {
                    return None;
                }
                r.skip()?;
                rmp_serde::from_slice(self.bytes.get(start..r.pos())?).ok()
            }
            PayloadFormat::Json => self.json().ok()?.get("metadata")?.as_object().cloned(),
        }
    }
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

/// Whether `b` is exactly one MessagePack value that reads as JSON: map
/// keys are strings, strings are UTF-8, no byte strings or extensions, at
/// most [`MAX_PAYLOAD_DEPTH`] levels of nesting.
pub(crate) fn json_compatible(b: &[u8]) -> bool {
    crate::msgpack::walk_json(b, MAX_PAYLOAD_DEPTH, None).is_some()
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

/// Text that shares the bytes it was read from (checked UTF-8).
#[derive(Clone, PartialEq, Eq)]
struct Text(Bytes);

impl Text {
    fn from_string(s: String) -> Text {
        Text(Bytes::from(s))
    }
    fn as_str(&self) -> &str {
        // Checked when made; a failure here is impossible and reads empty.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// One immutable event of a stream: cheap to clone (a reference count),
/// its payload decoded only when asked.
///
/// ```
/// # use rheo::{Event, EventParts, Payload, Timestamp};
/// #[derive(serde::Deserialize)]
/// struct Paid { amount: u64 }
/// # let event = Event::from(EventParts { payload: Payload::from_json(r#"{"amount": 5}"#)?,
/// #     ..EventParts::new("orders", 0, 1) });
/// let paid: Paid = event.decode()?;
/// assert_eq!((event.stream(), event.sequence(), paid.amount), ("orders", 1, 5));
/// # Ok::<(), rheo::Error>(())
/// ```
#[derive(Clone)]
pub struct Event(Arc<Inner>);

struct Inner {
    stream: Arc<str>,
    partition: u32,
    sequence: u64,
    timestamp: Timestamp,
    doc: Document,
    /// Returned by an append that wrote nothing (see [`Event::is_duplicate`]).
    duplicate: bool,
}

/// The document part of a stored event — id, key, type, metadata and
/// payload — as a record holds it, sharing the record's bytes.
#[derive(Clone, PartialEq)]
pub struct Document {
    id: Text,
    key: Option<Text>,
    event_type: Option<Text>,
    metadata: Metadata,
    payload: Payload,
}

impl Document {
    /// Reads a record's MessagePack document `[id, key, type, metadata,
    /// payload]`, sharing its bytes. The shape, the strings and the
    /// metadata are checked here, the payload when it is decoded. `Err`
    /// says what is wrong.
    pub fn parse(doc: Bytes) -> std::result::Result<Document, DecodeError> {
        let mut r = Reader::new(&doc);
        if !matches!(r.item(), Some(Item::Array(5))) {
            return Err(DecodeError::invalid("record document: not an array of 5"));
        }
        let mut text = |what: &str, optional: bool| -> std::result::Result<Option<Text>, DecodeError> {
            let start = r.pos();
            match r.item() {
                Some(Item::Scalar(Scalar::Str(s))) => {
                    std::str::from_utf8(s)
                        .map_err(|_| DecodeError::invalid(format!("record document: {what} is not UTF-8")))?;
                    let end = r.pos();
                    Ok(Some(Text(doc.slice(end - s.len()..end))))
                }
                Some(Item::Scalar(Scalar::Null)) if optional => Ok(None),
                _ => Err(DecodeError::invalid(format!("record document: bad {what} at byte {start}"))),
            }
        };
        let id = text("id", false)?.unwrap_or(Text(Bytes::new()));
        let key = text("key", true)?;
        let event_type = text("type", true)?;
        let start = r.pos();
        let metadata = if doc.get(start) == Some(&0x80) {
            let _ = r.skip();
            Metadata::new()
        } else {
            r.skip().ok_or("record document: bad metadata")?;
            rmp_serde::from_slice(&doc[start..r.pos()])
                .map_err(|e| DecodeError::invalid(format!("record document: metadata: {e}")))?
        };
        if r.pos() >= doc.len() {
            return Err(DecodeError::invalid("record document: no payload"));
        }
        // Checked once here, so that what reads the record and what indexes
        // it agree, and a payload that can't be decoded is damage reported
        // at its record, not an error in a consumer.
        if !json_compatible(&doc[r.pos()..]) {
            return Err(DecodeError::invalid(
                "record document: the payload is not one JSON-compatible MessagePack value",
            ));
        }
        let payload = Payload::from_checked_msgpack(doc.slice(r.pos()..));
        Ok(Document { id, key, event_type, metadata, payload })
    }

    /// The event id.
    pub fn id(&self) -> &str {
        self.id.as_str()
    }
    /// The routing key.
    pub fn key(&self) -> Option<&str> {
        self.key.as_ref().map(Text::as_str)
    }
    /// The type.
    pub fn event_type(&self) -> Option<&str> {
        self.event_type.as_ref().map(Text::as_str)
    }
    /// The metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }
    /// The payload.
    pub fn payload(&self) -> &Payload {
        &self.payload
    }

    /// The event at this position holding this document.
    pub fn into_event(self, stream: &Arc<str>, partition: u32, sequence: u64, timestamp: Timestamp) -> Event {
        Event(Arc::new(Inner { stream: stream.clone(), partition, sequence, timestamp, doc: self, duplicate: false }))
    }
}

impl std::fmt::Debug for Document {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Document")
            .field("id", &self.id())
            .field("key", &self.key())
            .field("event_type", &self.event_type())
            .field("metadata", &self.metadata)
            .field("payload", &self.payload)
            .finish()
    }
}

/// Where a backend stored an appended event: what
/// `Backend::append_batch` returns for each
/// event, from which the facade builds the [`Event`] it hands back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The partition it went to.
    pub partition: u32,
    /// Its sequence in that partition.
    pub sequence: u64,
    /// Its timestamp: the one given to the append, else the backend's clock.
    pub timestamp: Timestamp,
    /// True when nothing was written: an event with the same id was already
    /// in the stream (within its dedupe window), and this is where that
    /// original is (the facade returns it, marked
    /// [`Event::is_duplicate`]).
    pub duplicate: bool,
}

impl Position {
    /// Where a new event was stored.
    pub fn new(partition: u32, sequence: u64, timestamp: Timestamp) -> Self {
        Position { partition, sequence, timestamp, duplicate: false }
    }

    /// Where the original of a duplicate is (nothing was written).
    pub fn duplicate_of(partition: u32, sequence: u64, timestamp: Timestamp) -> Self {
        Position { partition, sequence, timestamp, duplicate: true }
    }
}

/// Everything an [`Event`] holds, to build one by hand (tests, tools,
/// bridges); backends build events themselves.
#[derive(Debug, Clone, PartialEq)]
pub struct EventParts {
    /// The id.
    pub id: String,
    /// The stream.
    pub stream: Arc<str>,
    /// The partition.
    pub partition: u32,
    /// The sequence.
    pub sequence: u64,
    /// The timestamp.
    pub timestamp: Timestamp,
    /// The routing key.
    pub key: Option<String>,
    /// The type.
    pub event_type: Option<String>,
    /// The metadata.
    pub metadata: Metadata,
    /// The payload.
    pub payload: Payload,
}

impl EventParts {
    /// An event of `stream` at this position with id `"{partition}-{sequence}"`,
    /// timestamp 0, no key, type or metadata, and a `null` payload: set the
    /// rest with struct update syntax.
    pub fn new(stream: &str, partition: u32, sequence: u64) -> EventParts {
        EventParts {
            id: format!("{partition}-{sequence}"),
            stream: Arc::from(stream),
            partition,
            sequence,
            timestamp: Timestamp::EPOCH,
            key: None,
            event_type: None,
            metadata: Metadata::new(),
            payload: Payload::from_value(&Value::Null),
        }
    }
}

impl From<EventParts> for Event {
    fn from(p: EventParts) -> Event {
        let doc = Document {
            id: Text::from_string(p.id),
            key: p.key.map(Text::from_string),
            event_type: p.event_type.map(Text::from_string),
            metadata: p.metadata,
            payload: p.payload,
        };
        Event(Arc::new(Inner {
            stream: p.stream,
            partition: p.partition,
            sequence: p.sequence,
            timestamp: p.timestamp,
            doc,
            duplicate: false,
        }))
    }
}

impl Event {
    /// Unique id; a time-ordered UUIDv7 when the producer gave none.
    pub fn id(&self) -> &str {
        self.0.doc.id()
    }
    /// True when this event was returned by an append that wrote nothing,
    /// because an event with the same id was already in the stream (within
    /// its dedupe window): this is that original, as stored. A producer
    /// that retries an append after an `Ambiguous` error with the same
    /// explicit id ([`AppendOptions::id`]) gets the original either way.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt").block_on(async {
    /// use rheo::{AppendOptions, Rheo, StreamOptions};
    /// let rheo = Rheo::open("memory:").await?;
    /// rheo.create_stream("orders", StreamOptions::new()).await?;
    /// let first = rheo.append("orders", &serde_json::json!({"n": 1}), AppendOptions::new().id("order-1")).await?;
    /// let again = rheo.append("orders", &serde_json::json!({"n": 1}), AppendOptions::new().id("order-1")).await?;
    /// assert!(!first.is_duplicate() && again.is_duplicate());
    /// assert_eq!(again.sequence(), first.sequence());
    /// # Ok::<(), rheo::Error>(()) }).expect("example");
    /// ```
    pub fn is_duplicate(&self) -> bool {
        self.0.duplicate
    }
    /// This event, marked as returned by an append that wrote nothing.
    pub(crate) fn into_duplicate(self) -> Event {
        let i = &*self.0;
        Event(Arc::new(Inner {
            stream: i.stream.clone(),
            partition: i.partition,
            sequence: i.sequence,
            timestamp: i.timestamp,
            doc: i.doc.clone(),
            duplicate: true,
        }))
    }
    /// The stream it belongs to.
    pub fn stream(&self) -> &str {
        &self.0.stream
    }
    /// The stream's name, shared.
    pub(crate) fn stream_name(&self) -> &Arc<str> {
        &self.0.stream
    }
    /// The partition it was routed to.
    pub fn partition(&self) -> u32 {
        self.0.partition
    }
    /// Its position in the partition: starts at 1, no gaps.
    pub fn sequence(&self) -> u64 {
        self.0.sequence
    }
    /// When it was appended (or the time the producer gave).
    pub fn timestamp(&self) -> Timestamp {
        self.0.timestamp
    }
    /// The routing key, if any.
    pub fn key(&self) -> Option<&str> {
        self.0.doc.key()
    }
    /// The event type, taken from the payload's `"type"` field.
    pub fn event_type(&self) -> Option<&str> {
        self.0.doc.event_type()
    }
    /// Metadata: the append option's merged with the payload's `"metadata"`.
    pub fn metadata(&self) -> &Metadata {
        &self.0.doc.metadata
    }
    /// The document as appended, with all its fields.
    pub fn payload(&self) -> &Payload {
        &self.0.doc.payload
    }
    /// The lineage fields found in the metadata.
    pub fn lineage(&self) -> Lineage {
        Lineage::from_metadata(&self.0.doc.metadata)
    }
    /// Decodes the payload into `T` (see [`Payload::decode`]); an error
    /// names this event.
    ///
    /// ```
    /// # use rheo::{Event, EventParts, Payload};
    /// #[derive(serde::Deserialize)]
    /// struct Paid { amount: u64 }
    /// # let event = Event::from(EventParts { payload: Payload::from_json(r#"{"amount": 5}"#)?,
    /// #     ..EventParts::new("orders", 0, 1) });
    /// let paid: Paid = event.decode()?;
    /// assert_eq!(paid.amount, 5);
    /// # Ok::<(), rheo::Error>(())
    /// ```
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T> {
        self.payload().decode().map_err(|e| {
            e.payload_context(|| {
                format!("of event {:?} ({}/{} #{})", self.id(), self.stream(), self.partition(), self.sequence())
            })
        })
    }

    /// Everything it holds, as parts (copies the strings).
    pub fn to_parts(&self) -> EventParts {
        EventParts {
            id: self.id().to_owned(),
            stream: self.0.stream.clone(),
            partition: self.0.partition,
            sequence: self.0.sequence,
            timestamp: self.0.timestamp,
            key: self.key().map(str::to_owned),
            event_type: self.event_type().map(str::to_owned),
            metadata: self.0.doc.metadata.clone(),
            payload: self.0.doc.payload.clone(),
        }
    }

    /// The value at a query path (see [`crate::Query`] for how paths
    /// resolve). A path with an empty dotted segment names no value
    /// ([`crate::is_valid_path`]); a payload that does not decode has none.
    pub fn field(&self, path: &str) -> Option<Value> {
        if !super::path::is_valid_path(path) {
            return None;
        }
        match path {
            "id" => Some(Value::String(self.id().to_owned())),
            "stream" => Some(Value::String(self.stream().to_owned())),
            "partition" => Some(Value::from(self.partition())),
            "sequence" => Some(Value::from(self.sequence())),
            "timestamp" => Some(Value::from(self.timestamp().as_millis())),
            "key" => self.key().map(|k| Value::String(k.to_owned())),
            "type" => self.event_type().map(|t| Value::String(t.to_owned())),
            _ => {
                if LINEAGE_FIELDS.contains(&path) {
                    return self.metadata().get(path).cloned();
                }
                if let Some(rest) = path.strip_prefix("metadata.") {
                    return lookup_map(self.metadata(), rest).cloned();
                }
                let rest = path.strip_prefix("payload.").unwrap_or(path);
                self.payload().field(rest)
            }
        }
    }
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (&*self.0, &*other.0);
        Arc::ptr_eq(&self.0, &other.0)
            || (a.stream == b.stream
                && a.partition == b.partition
                && a.sequence == b.sequence
                && a.timestamp == b.timestamp
                && a.doc == b.doc)
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("id", &self.id())
            .field("stream", &self.stream())
            .field("partition", &self.partition())
            .field("sequence", &self.sequence())
            .field("timestamp", &self.timestamp())
            .field("key", &self.key())
            .field("event_type", &self.event_type())
            .field("metadata", self.metadata())
            .field("payload", self.payload())
            .finish()
    }
}

/// Reads the JSON form [`Event`]'s `Serialize` writes.
impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            id: String,
            stream: String,
            partition: u32,
            sequence: u64,
            timestamp: Timestamp,
            #[serde(default)]
            key: Option<String>,
            #[serde(rename = "type", default)]
            event_type: Option<String>,
            #[serde(default)]
            metadata: Metadata,
            payload: Payload,
        }
        let w = Wire::deserialize(d)?;
        Ok(Event::from(EventParts {
            id: w.id,
            stream: Arc::from(w.stream),
            partition: w.partition,
            sequence: w.sequence,
            timestamp: w.timestamp,
            key: w.key,
            event_type: w.event_type,
            metadata: w.metadata,
            payload: w.payload,
        }))
    }
}

/// The JSON form (`rheo read --json`): `id`, `stream`, `partition`,
/// `sequence`, `timestamp`, `key` and `type` when present, `metadata`,
/// `payload`.
impl Serialize for Event {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let n = 7
            + usize::from(self.key().is_some())
            + usize::from(self.event_type().is_some())
            + usize::from(self.is_duplicate());
        let mut st = s.serialize_struct("Event", n)?;
        st.serialize_field("id", self.id())?;
        st.serialize_field("stream", self.stream())?;
        st.serialize_field("partition", &self.partition())?;
        st.serialize_field("sequence", &self.sequence())?;
        st.serialize_field("timestamp", &self.timestamp())?;
        if let Some(k) = self.key() {
            st.serialize_field("key", k)?;
        }
        if let Some(t) = self.event_type() {
            st.serialize_field("type", t)?;
        }
        st.serialize_field("metadata", self.metadata())?;
        st.serialize_field("payload", self.payload())?;
        if self.is_duplicate() {
            st.serialize_field("duplicate", &true)?;
        }
        st.end()
    }
}

fn lookup_map<'a>(map: &'a Metadata, path: &str) -> Option<&'a Value> {
    let (head, tail) = match path.split_once('.') {
        Some((h, t)) => (h, Some(t)),
        None => (path, None),
    };
    let v = map.get(head)?;
    match tail {
        Some(t) => lookup(v, t),
        None => Some(v),
    }
}

fn lookup<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(value, |v, part| match v {
        Value::Object(m) => m.get(part),
        Value::Array(a) => part.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

pub use super::path::LINEAGE_FIELDS;

/// Where an event came from: stored in its metadata under the keys of
/// [`LINEAGE_FIELDS`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lineage {
    /// Ties together every event of one business transaction.
    pub correlation_id: Option<String>,
    /// The id of the event that caused this one.
    pub causation_id: Option<String>,
    /// The service that produced it.
    pub producer: Option<String>,
    /// The payload's schema name.
    pub schema: Option<String>,
    /// The payload's schema version.
    pub schema_version: Option<u32>,
}

impl Lineage {
    /// Reads the lineage keys of a metadata map; ignores values of the wrong type.
    pub fn from_metadata(m: &Metadata) -> Self {
        let s = |k: &str| m.get(k).and_then(Value::as_str).map(str::to_owned);
        Lineage {
            correlation_id: s("correlation_id"),
            causation_id: s("causation_id"),
            producer: s("producer"),
            schema: s("schema"),
            schema_version: m.get("schema_version").and_then(Value::as_u64).and_then(|v| u32::try_from(v).ok()),
        }
    }

    /// The lineage of an event caused by `parent`: same correlation (the
    /// parent's, or the parent's id when it has none), causation = parent id.
    pub fn caused_by(parent: &Event) -> Self {
        let p = parent.lineage();
        Lineage {
            correlation_id: Some(p.correlation_id.unwrap_or_else(|| parent.id().to_owned())),
            causation_id: Some(parent.id().to_owned()),
            ..Lineage::default()
        }
    }

    fn write_into(&self, m: &mut Metadata) {
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                m.insert(k.to_owned(), v);
            }
        };
        put("correlation_id", self.correlation_id.clone().map(Value::String));
        put("causation_id", self.causation_id.clone().map(Value::String));
        put("producer", self.producer.clone().map(Value::String));
        put("schema", self.schema.clone().map(Value::String));
        put("schema_version", self.schema_version.map(Value::from));
    }
}

/// Options of one append. Every field is optional.
///
/// ```
/// use rheo::AppendOptions;
/// let opts = AppendOptions::new().key("customer-7").producer("checkout").metadata("region", "eu");
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct AppendOptions {
    pub(crate) id: Option<String>,
    pub(crate) key: Option<String>,
    pub(crate) partition: Option<u32>,
    pub(crate) metadata: Metadata,
    pub(crate) timestamp: Option<Timestamp>,
}

impl AppendOptions {
    /// No options.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the event id (default: a new UUIDv7).
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }
    /// Sets the routing key (default: the payload's `"key"` field).
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }
    /// Sends the event to this partition, bypassing key routing.
    pub fn partition(mut self, partition: u32) -> Self {
        self.partition = Some(partition);
        self
    }
    /// Adds one metadata entry. The payload's own `"metadata"` wins on conflict.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }
    /// Adds every entry of a metadata map.
    pub fn metadata_map(mut self, map: Metadata) -> Self {
        self.metadata.extend(map);
        self
    }
    /// Sets the event's timestamp (default: the backend clock at append).
    pub fn timestamp(mut self, t: Timestamp) -> Self {
        self.timestamp = Some(t);
        self
    }
    /// Sets the lineage fields that are `Some` in `lineage`.
    pub fn lineage(mut self, lineage: &Lineage) -> Self {
        lineage.write_into(&mut self.metadata);
        self
    }
    /// Marks the event as caused by `parent` (see [`Lineage::caused_by`]).
    pub fn caused_by(self, parent: &Event) -> Self {
        self.lineage(&Lineage::caused_by(parent))
    }
    /// Sets `correlation_id`.
    pub fn correlation_id(self, id: impl Into<String>) -> Self {
        self.metadata("correlation_id", id.into())
    }
    /// Sets `producer`.
    pub fn producer(self, producer: impl Into<String>) -> Self {
        self.metadata("producer", producer.into())
    }
    /// Sets `schema` and `schema_version`.
    pub fn schema(self, schema: impl Into<String>, version: u32) -> Self {
        self.metadata("schema", schema.into()).metadata("schema_version", version)
    }
}

/// An event ready to be written: normalized from a payload and its
/// [`AppendOptions`], but not yet given a partition, sequence or timestamp.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// The id.
    pub id: String,
    /// The routing key.
    pub key: Option<String>,
    /// The type, from the payload.
    pub event_type: Option<String>,
    /// The explicit partition, if any.
    pub partition: Option<u32>,
    /// The merged metadata.
    pub metadata: Metadata,
    /// The payload, encoded once.
    pub payload: Payload,
    /// The producer's timestamp, if any.
    pub timestamp: Option<Timestamp>,
    /// True when the producer gave the id ([`AppendOptions::id`]): only
    /// such events can be duplicates (a generated id is new), so backends
    /// that keep a window of recent ids keep only these.
    pub id_given: bool,
}

impl NewEvent {
    /// Applies the append rules: `type` from the payload's `"type"`; `key` from
    /// the option, else the payload's `"key"`; metadata = option metadata merged
    /// with the payload's `"metadata"` object (payload wins); id generated when
    /// absent. The fields are read from the encoded payload; nothing is
    /// decoded but them.
    pub fn prepare(payload: impl Into<Payload>, opts: AppendOptions) -> Self {
        let payload = payload.into();
        let event_type = payload.top_str("type");
        let key = opts.key.or_else(|| payload.top_str("key"));
        let mut metadata = opts.metadata;
        if let Some(m) = payload.top_metadata() {
            metadata.extend(m);
        }
        let id_given = opts.id.is_some();
        NewEvent {
            id_given,
            id: opts.id.unwrap_or_else(|| crate::ids::new_event_id().to_string()),
            key,
            event_type,
            partition: opts.partition,
            metadata,
            payload,
            timestamp: opts.timestamp,
        }
    }

    /// The size this event is charged against the event size limit: its
    /// payload's encoded length (MessagePack, as stored), its metadata's
    /// JSON length, and its id, key and type.
    pub fn encoded_len(&self) -> usize {
        self.id.len()
            + self.key.as_ref().map_or(0, String::len)
            + self.event_type.as_ref().map_or(0, String::len)
            + self.payload.as_bytes().len()
            + if self.metadata.is_empty() { 2 } else { json_len(&self.metadata) }
    }

    /// Turns it into a stored event.
    pub fn into_event(self, stream: &Arc<str>, partition: u32, sequence: u64, now: Timestamp) -> Event {
        let doc = Document {
            id: Text::from_string(self.id),
            key: self.key.map(Text::from_string),
            event_type: self.event_type.map(Text::from_string),
            metadata: self.metadata,
            payload: self.payload,
        };
        doc.into_event(stream, partition, sequence, self.timestamp.unwrap_or(now))
    }
}

/// The JSON length of a value, counted without allocating the text.
fn json_len<T: Serialize + ?Sized>(value: &T) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // A JSON value always serializes; the counter never fails.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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

    #[test]
    fn prepare_takes_type_key_and_metadata_from_payload() {
        let e = NewEvent::prepare(
            Payload::from_value(&json!({"type": "paid", "key": "k1", "metadata": {"a": 2}, "x": 1})),
            AppendOptions::new().metadata("a", 1).metadata("b", 1),
        );
        assert_eq!(e.event_type.as_deref(), Some("paid"));
        assert_eq!(e.key.as_deref(), Some("k1"));
        assert_eq!(e.metadata.get("a"), Some(&json!(2)));
        assert_eq!(e.metadata.get("b"), Some(&json!(1)));
        assert_eq!(e.payload.json().expect("json")["x"], json!(1));
        assert_eq!(e.id.len(), 36);
    }

    #[test]
    fn option_key_wins_over_payload_key() {
        let e = NewEvent::prepare(Payload::from_value(&json!({"key": "p"})), AppendOptions::new().key("o"));
        assert_eq!(e.key.as_deref(), Some("o"));
    }

    #[test]
    fn encoded_len_counts_the_stored_payload() {
        let e = NewEvent::prepare(Payload::from_value(&json!("abc")), AppendOptions::new().id("i"));
        // id 1 + MessagePack "abc" 4 + empty metadata 2.
        assert_eq!(e.encoded_len(), 1 + 4 + 2);
    }

    #[test]
    fn encoding_once_matches_the_json_encoding_and_reads_the_fields_back() {
        #[derive(Serialize)]
        struct Order<'a> {
            #[serde(rename = "type")]
            kind: &'a str,
            key: &'a str,
            n: u8,
            f: f32,
            metadata: std::collections::BTreeMap<&'a str, u32>,
        }
        let o = Order { kind: "placed", key: "c-1", n: 7, f: 0.5, metadata: [("a", 1)].into() };
        let p = Payload::encode(&o).expect("encode");
        assert_eq!(p.format(), PayloadFormat::MessagePack);
        assert_eq!(p.json().expect("json"), &serde_json::to_value(&o).expect("value"));
        let e = NewEvent::prepare(p, AppendOptions::new());
        assert_eq!((e.event_type.as_deref(), e.key.as_deref()), (Some("placed"), Some("c-1")));
        assert_eq!(e.metadata.get("a"), Some(&json!(1)));
    }

    #[test]
    fn payloads_json_cannot_hold_are_encoded_as_their_json_form() {
        let by_number: std::collections::BTreeMap<u32, &str> = [(1, "a")].into();
        let p = Payload::encode(&by_number).expect("encode");
        assert_eq!(p.json().expect("json"), &json!({"1": "a"}));
        assert!(json_compatible(p.as_bytes()));
        assert!(Payload::from_msgpack(rmp_serde::to_vec(&by_number).expect("raw")).is_err());
        assert!(Payload::from_msgpack(vec![0xc4, 1, 0]).is_err(), "a byte string");
        assert!(Payload::from_msgpack(vec![0x01, 0x02]).is_err(), "two values");
        assert!(Payload::from_json("{").is_err());
        let nested = |depth: usize| {
            let mut b = vec![0x91; depth];
            b.push(0xc0);
            b
        };
        assert!(Payload::from_msgpack(nested(MAX_PAYLOAD_DEPTH)).expect("deep").json().is_ok());
        assert!(Payload::from_msgpack(nested(MAX_PAYLOAD_DEPTH + 1)).is_err());
        let too_deep = Payload::from_msgpack(nested(MAX_PAYLOAD_DEPTH)).expect("deep").json().expect("json").clone();
        let too_deep = json!([too_deep]);
        assert!(Payload::encode(&too_deep).is_err());
        assert!(Payload::from_value(&too_deep).check().is_err());
        assert!(Payload::from_value(&json!({"a": 1})).check().is_ok());
    }

    #[test]
    fn a_stored_document_reads_back_sharing_its_bytes() {
        let meta: Metadata = serde_json::from_value(json!({"producer": "p"})).expect("map");
        let payload = json!({"a": [1, 2.5, "x"]});
        let doc = rmp_serde::to_vec(&("id-1", Some("k"), Some("t"), &meta, &payload)).expect("doc");
        let stream: Arc<str> = Arc::from("s");
        let e =
            Document::parse(Bytes::from(doc)).expect("document").into_event(&stream, 2, 9, Timestamp::from_millis(5));
        assert_eq!(
            (e.id(), e.key(), e.event_type(), e.partition(), e.sequence()),
            ("id-1", Some("k"), Some("t"), 2, 9)
        );
        assert_eq!(e.metadata().get("producer"), Some(&json!("p")));
        assert_eq!(e.payload().json().expect("json"), &payload);
        let copy = e.clone();
        assert!(Arc::ptr_eq(&copy.0, &e.0), "a clone is a reference count");
        for bad in [vec![0x93, 0xa1, b'x', 0xc0, 0xc0], vec![0x95, 0x01, 0xc0, 0xc0, 0x80, 0xc0]] {
            assert!(Document::parse(Bytes::from(bad.clone())).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn payload_fields_read_from_the_bytes_agree_with_the_decoded_document() {
        let doc = json!({"a": {"b": [1, {"c": "x"}], "d": null}, "a.b": 2, "n": 1.5, "dup": 1, "arr": [[0, 1]]});
        let paths = ["a", "a.b", "a.b.0", "a.b.1.c", "a.b.2", "a.d", "a.b.x", "n", "n.x", "dup", "arr.0.1", "missing"];
        let raw = Payload::from_value(&doc);
        let decoded = Payload::from_value(&doc);
        decoded.json().expect("json");
        for path in paths {
            assert_eq!(raw.field(path), decoded.field(path), "{path}");
            assert_eq!(raw.field(path), lookup(&doc, path).cloned(), "{path}");
        }
        // Duplicate keys (only a hand-made document has them): the last wins.
        let dup = Payload::from_msgpack(vec![0x82, 0xa1, b'k', 0x01, 0xa1, b'k', 0x02]).expect("msgpack");
        assert_eq!(dup.field("k"), Some(json!(2)));
        assert_eq!(dup.json().expect("json")["k"], json!(2));
    }

    #[test]
    fn field_paths_resolve() {
        let e = NewEvent::prepare(
            Payload::from_value(&json!({"type": "t", "order": {"customer": {"id": 7}}, "items": [1, 2]})),
            AppendOptions::new().correlation_id("c1").metadata("region", json!({"name": "eu"})),
        )
        .into_event(&Arc::from("s"), 0, 1, Timestamp::EPOCH);
        assert_eq!(e.field("type"), Some(json!("t")));
        assert_eq!(e.field("order.customer.id"), Some(json!(7)));
        assert_eq!(e.field("payload.items.1"), Some(json!(2)));
        assert_eq!(e.field("correlation_id"), Some(json!("c1")));
        assert_eq!(e.field("metadata.region.name"), Some(json!("eu")));
        assert_eq!(e.field("missing"), None);
    }
}
