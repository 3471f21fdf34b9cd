//! What an append takes: the events ([`NewEvent`]), their options
//! ([`AppendOptions`]) and lineage ([`Lineage`]).

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use super::event::{Document, Event, Lineage, Text};
use super::path::DELIVER_AT;
use super::payload::{Metadata, Payload};
use super::time::Timestamp;

/// Options of one append. Every field is optional.
///
/// ```
/// use rheo::AppendOptions;
/// let opts = AppendOptions::new().key("customer-7").producer("checkout").metadata("region", "eu");
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct AppendOptions {
    pub(crate) id: Option<Text>,
    pub(crate) key: Option<Text>,
    pub(crate) partition: Option<u32>,
    pub(crate) metadata: Metadata,
    pub(crate) timestamp: Option<Timestamp>,
    /// A delay not yet turned into a `deliver_at` (see [`AppendOptions::delay`]).
    pub(crate) delay: Option<std::time::Duration>,
}

impl AppendOptions {
    /// No options.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the event id (default: a new UUIDv7).
    pub fn id(mut self, id: impl AsRef<str>) -> Self {
        self.id = Some(Text::copied(id.as_ref()));
        self
    }
    /// Sets the routing key (default: the payload's `"key"` field).
    pub fn key(mut self, key: impl AsRef<str>) -> Self {
        self.key = Some(Text::copied(key.as_ref()));
        self
    }
    /// Sends the event to this partition, bypassing key routing.
    pub fn partition(mut self, partition: u32) -> Self {
        self.partition = Some(partition);
        self
    }
    /// Adds one metadata entry. The payload's own `"metadata"` wins on conflict.
    /// A [`DELIVER_AT`] entry replaces an earlier [`AppendOptions::delay`].
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        let key = key.into();
        if key == DELIVER_AT {
            self.delay = None;
        }
        self.metadata.insert(key, value.into());
        self
    }
    /// Adds every entry of a metadata map (a [`DELIVER_AT`] entry replaces
    /// an earlier [`AppendOptions::delay`]).
    pub fn metadata_map(mut self, map: Metadata) -> Self {
        if map.contains_key(DELIVER_AT) {
            self.delay = None;
        }
        self.metadata.extend(map);
        self
    }
    /// Sets the event's timestamp (default: the backend clock at append).
    pub fn timestamp(mut self, t: Timestamp) -> Self {
        self.timestamp = Some(t);
        self
    }
    /// Schedules the event: no consumer group claims it before `t` (it is
    /// readable and queryable at once, and its groups count it as
    /// unsettled). Stored as the metadata entry [`DELIVER_AT`]
    /// (milliseconds since the Unix epoch); a time already past is due at
    /// once. Replaces an earlier [`AppendOptions::delay`]. A backend that
    /// does not schedule (`Capabilities::scheduled_delivery`) refuses the
    /// append with `Unsupported`.
    ///
    /// ```
    /// use rheo::{AppendOptions, NewEvent, Timestamp};
    /// let at = Timestamp::from_millis(1_900_000_000_000);
    /// let e = NewEvent::prepare(serde_json::json!({"type": "reminder"}), AppendOptions::new().deliver_at(at));
    /// assert_eq!(e.deliver_at(), Some(at));
    /// assert_eq!(e.metadata()["deliver_at"], 1_900_000_000_000_i64);
    /// ```
    pub fn deliver_at(mut self, t: Timestamp) -> Self {
        self.delay = None;
        self.metadata(DELIVER_AT, t.as_millis())
    }
    /// Schedules the event `d` from now (the handle's clock when it is
    /// appended): [`AppendOptions::deliver_at`] of that time. Replaces an
    /// earlier `deliver_at`.
    pub fn delay(mut self, d: std::time::Duration) -> Self {
        self.metadata.remove(DELIVER_AT);
        self.delay = Some(d);
        self
    }
    /// Turns a delay into a `deliver_at` measured from `now`.
    pub(crate) fn resolve_delay(&mut self, now: Timestamp) {
        if let Some(d) = self.delay.take() {
            self.metadata.insert(DELIVER_AT.to_owned(), now.saturating_add(d).as_millis().into());
        }
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
///
/// Its id, key, type and encoded payload are views of shared memory: a
/// payload encoded by [`Payload::encode`] and the strings an append makes
/// or copies are cut from the thread's shared chunk (a part over 1 KiB,
/// or a payload given already encoded, keeps its own bytes), and the
/// [`Event`] an append returns shares them too.
///
/// ```
/// use rheo::{AppendOptions, NewEvent, Payload};
/// let payload = Payload::from_json(r#"{"type": "paid", "amount": 5}"#)?;
/// let e = NewEvent::prepare(payload, AppendOptions::new().key("customer-7"));
/// assert_eq!((e.event_type(), e.key()), (Some("paid"), Some("customer-7")));
/// assert!(!e.id_given() && e.id().len() == 36);
/// # Ok::<(), rheo::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub(crate) id: Text,
    pub(crate) key: Option<Text>,
    pub(crate) event_type: Option<Text>,
    pub(crate) partition: Option<u32>,
    pub(crate) metadata: Metadata,
    pub(crate) payload: Payload,
    pub(crate) timestamp: Option<Timestamp>,
    pub(crate) id_given: bool,
}

impl NewEvent {
    /// Applies the append rules: `type` from the payload's `"type"`; `key` from
    /// the option, else the payload's `"key"`; metadata = option metadata merged
    /// with the payload's `"metadata"` object (payload wins); id generated when
    /// absent. The fields are read from the encoded payload; nothing is
    /// decoded but them.
    ///
    /// A [`AppendOptions::delay`] is measured from the system clock here;
    /// [`Rheo`](crate::Rheo)'s appends measure it from the handle's clock.
    pub fn prepare(payload: impl Into<Payload>, mut opts: AppendOptions) -> Self {
        if opts.delay.is_some() {
            opts.resolve_delay(Timestamp::now());
        }
        let payload = payload.into();
        let top = payload.top_fields();
        let event_type = top.event_type;
        let key = opts.key.or(top.key);
        let mut metadata = opts.metadata;
        if let Some(m) = top.metadata {
            metadata.extend(m);
        }
        let id_given = opts.id.is_some();
        NewEvent {
            id_given,
            id: opts.id.unwrap_or_else(|| {
                let mut text = uuid::Uuid::encode_buffer();
                Text::copied(crate::ids::new_event_id().hyphenated().encode_lower(&mut text))
            }),
            key,
            event_type,
            partition: opts.partition,
            metadata,
            payload,
            timestamp: opts.timestamp,
        }
    }

    /// The id.
    pub fn id(&self) -> &str {
        &self.id
    }
    /// True when the producer gave the id ([`AppendOptions::id`]): only
    /// such events can be duplicates (a generated id is new), so backends
    /// that keep a window of recent ids keep only these.
    pub fn id_given(&self) -> bool {
        self.id_given
    }
    /// The routing key.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }
    /// The type, from the payload.
    pub fn event_type(&self) -> Option<&str> {
        self.event_type.as_deref()
    }
    /// The explicit partition, if any.
    pub fn partition(&self) -> Option<u32> {
        self.partition
    }
    /// The merged metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }
    /// The payload, encoded once.
    pub fn payload(&self) -> &Payload {
        &self.payload
    }
    /// The producer's timestamp, if any.
    pub fn timestamp(&self) -> Option<Timestamp> {
        self.timestamp
    }
    /// When the event is scheduled for ([`AppendOptions::deliver_at`]): the
    /// metadata entry [`DELIVER_AT`] when it is an integer.
    pub fn deliver_at(&self) -> Option<Timestamp> {
        super::event::deliver_at_of(&self.metadata)
    }

    /// The size this event is charged against the event size limit: its
    /// payload's encoded length (MessagePack, as stored), its metadata's
    /// JSON length, and its id, key and type.
    pub fn encoded_len(&self) -> usize {
        self.id.len()
            + self.key.as_ref().map_or(0, |k| k.len())
            + self.event_type.as_ref().map_or(0, |t| t.len())
            + self.payload.as_bytes().len()
            + if self.metadata.is_empty() { 2 } else { json_len(&self.metadata) }
    }

    /// Turns it into a stored event.
    pub fn into_event(self, stream: &Arc<str>, partition: u32, sequence: u64, now: Timestamp) -> Event {
        let doc = Document {
            id: self.id,
            key: self.key,
            event_type: self.event_type,
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
