//! Events as stored and read ([`Event`], its [`Document`], where it went:
//! [`Position`]).
//!
//! An [`Event`] is a reference-counted view of one stored event: cloning it
//! (into a lease, a page, a dead letter, a handler) copies a pointer. Its
//! strings and payload share the bytes they were read from, and its payload
//! stays encoded until asked for ([`Payload::decode`], [`Payload::json`]).

use std::sync::Arc;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use super::path::LINEAGE_FIELDS;
use super::payload::{Metadata, Payload, json_compatible, lookup};
pub(crate) use super::text::Text;
use super::time::Timestamp;
use crate::decode::DecodeError;
use crate::error::Result;
use crate::msgpack::{Item, Reader, Scalar};

/// One immutable event of a stream: cheap to clone (a reference count),
/// its payload decoded only when asked.
///
/// An event read or fetched from a native directory shares the buffer it
/// was read into (at most 64 KiB, 8 KiB for a fetch) with the events read
/// beside it, instead of holding a copy: keeping one event keeps that
/// buffer. To keep a few events of a large read for long, keep what you
/// need of them (`decode` the payload, copy the id) rather than the events.
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
    pub(super) id: Text,
    pub(super) key: Option<Text>,
    pub(super) event_type: Option<Text>,
    pub(super) metadata: Metadata,
    pub(super) payload: Payload,
}

impl Document {
    /// Reads a record's MessagePack document `[id, key, type, metadata,
    /// payload]`, sharing its bytes. The shape, the strings and the
    /// metadata are checked here, the payload when it is decoded. `Err`
    /// says what is wrong.
    pub fn parse(doc: Bytes) -> std::result::Result<Document, DecodeError> {
        Document::parse_with(doc, |d| d)
    }

    /// As [`Document::parse`], the event of the record at once: of
    /// `stream`, at `partition`/`sequence`, stored at `timestamp` (what a
    /// read returns, built where it is parsed rather than moved there).
    pub fn parse_event(
        doc: Bytes,
        stream: &Arc<str>,
        partition: u32,
        sequence: u64,
        timestamp: Timestamp,
    ) -> std::result::Result<Event, DecodeError> {
        Document::parse_with(doc, |d| d.into_event(stream, partition, sequence, timestamp))
    }

    /// Parses `doc` and hands the document to `make`.
    #[inline(always)]
    fn parse_with<T>(doc: Bytes, make: impl FnOnce(Document) -> T) -> std::result::Result<T, DecodeError> {
        let mut r = Reader::new(&doc);
        if !matches!(r.item(), Some(Item::Array(5))) {
            return Err(DecodeError::invalid("record document: not an array of 5"));
        }
        let mut text = |what: &str, optional: bool| -> std::result::Result<Option<Text>, DecodeError> {
            let start = r.pos();
            match r.item() {
                Some(Item::Scalar(Scalar::Str(s))) => {
                    let end = r.pos();
                    match Text::checked(doc.slice(end - s.len()..end)) {
                        Some(t) => Ok(Some(t)),
                        None => Err(DecodeError::invalid(format!("record document: {what} is not UTF-8"))),
                    }
                }
                Some(Item::Scalar(Scalar::Null)) if optional => Ok(None),
                _ => Err(DecodeError::invalid(format!("record document: bad {what} at byte {start}"))),
            }
        };
        let id = text("id", false)?.unwrap_or_else(|| Text::copied(""));
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
        Ok(make(Document { id, key, event_type, metadata, payload }))
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
    /// explicit id ([`AppendOptions::id`](crate::AppendOptions::id)) gets the original either way.
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
    /// When the event is scheduled for: no consumer group claims it before
    /// then ([`AppendOptions::deliver_at`](crate::AppendOptions::deliver_at)).
    pub fn deliver_at(&self) -> Option<Timestamp> {
        deliver_at_of(&self.0.doc.metadata)
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

    pub(super) fn write_into(&self, m: &mut Metadata) {
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

/// The scheduled delivery time a metadata map holds: its
/// [`DELIVER_AT`](crate::DELIVER_AT) entry, when that is an integer.
pub(crate) fn deliver_at_of(metadata: &Metadata) -> Option<Timestamp> {
    if metadata.is_empty() {
        return None;
    }
    metadata.get(super::path::DELIVER_AT)?.as_i64().map(Timestamp::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::append::{AppendOptions, NewEvent};
    use crate::model::payload::{MAX_PAYLOAD_DEPTH, PayloadFormat};
    use serde_json::json;

    #[test]
    fn the_last_of_deliver_at_delay_and_a_deliver_at_entry_wins() {
        let t = Timestamp::from_millis(5_000);
        let at = |opts: AppendOptions| NewEvent::prepare(json!({}), opts).deliver_at();
        let d = std::time::Duration::from_secs(3600);
        assert_eq!(at(AppendOptions::new().delay(d).deliver_at(t)), Some(t));
        assert_eq!(at(AppendOptions::new().delay(d).metadata("deliver_at", 5_000)), Some(t));
        let mut map = Metadata::new();
        map.insert("deliver_at".into(), json!(5_000));
        assert_eq!(at(AppendOptions::new().delay(d).metadata_map(map)), Some(t));
        let later = at(AppendOptions::new().deliver_at(t).delay(d)).expect("scheduled");
        assert!(later > Timestamp::now(), "the delay replaced the earlier time");
        assert_eq!(at(AppendOptions::new().metadata("deliver_at", "soon")), None, "not a time");
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
