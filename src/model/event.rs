//! Events, append options and lineage.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::time::Timestamp;
use crate::error::{Error, Result};

/// A JSON object: the type of event metadata.
pub type Metadata = Map<String, Value>;

/// One immutable event of a stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Unique id; generated as a time-ordered UUIDv7 when the producer gives none.
    pub id: String,
    /// The stream it belongs to.
    pub stream: String,
    /// The partition it was routed to.
    pub partition: u32,
    /// Its position in the partition: starts at 1, no gaps.
    pub sequence: u64,
    /// When it was appended (or the time the producer gave).
    pub timestamp: Timestamp,
    /// The routing key, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The event type, taken from the payload's `"type"` field.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// Metadata: the append option's merged with the payload's `"metadata"`.
    #[serde(default)]
    pub metadata: Metadata,
    /// The document as appended, with all its fields.
    pub payload: Value,
}

impl Event {
    /// Decodes the payload as `T`.
    ///
    /// ```
    /// # use rheo::Event;
    /// #[derive(serde::Deserialize)]
    /// struct Paid { amount: u64 }
    /// # let event = Event { id: "e1".into(), stream: "s".into(), partition: 0, sequence: 1,
    /// #   timestamp: rheo::Timestamp::EPOCH, key: None, event_type: None,
    /// #   metadata: Default::default(), payload: serde_json::json!({"amount": 5}) };
    /// let paid: Paid = event.payload_as()?;
    /// assert_eq!(paid.amount, 5);
    /// # Ok::<(), rheo::Error>(())
    /// ```
    pub fn payload_as<T: DeserializeOwned>(&self) -> Result<T> {
        T::deserialize(&self.payload)
            .map_err(|e| Error::Payload { context: format!("of event {:?}", self.id), reason: e.to_string() })
    }

    /// The lineage fields found in the metadata.
    pub fn lineage(&self) -> Lineage {
        Lineage::from_metadata(&self.metadata)
    }

    /// The value at a query path (see [`crate::Query`] for how paths
    /// resolve). A path with an empty dotted segment names no value
    /// ([`crate::is_valid_path`]).
    pub fn field(&self, path: &str) -> Option<Value> {
        if !crate::model::query::is_valid_path(path) {
            return None;
        }
        match path {
            "id" => Some(Value::String(self.id.clone())),
            "stream" => Some(Value::String(self.stream.clone())),
            "partition" => Some(Value::from(self.partition)),
            "sequence" => Some(Value::from(self.sequence)),
            "timestamp" => Some(Value::from(self.timestamp.as_millis())),
            "key" => self.key.clone().map(Value::String),
            "type" => self.event_type.clone().map(Value::String),
            _ => {
                if LINEAGE_FIELDS.contains(&path) {
                    return self.metadata.get(path).cloned();
                }
                if let Some(rest) = path.strip_prefix("metadata.") {
                    return lookup_map(&self.metadata, rest).cloned();
                }
                let rest = path.strip_prefix("payload.").unwrap_or(path);
                lookup(&self.payload, rest).cloned()
            }
        }
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

/// The lineage metadata keys.
pub const LINEAGE_FIELDS: [&str; 5] = ["correlation_id", "causation_id", "producer", "schema", "schema_version"];

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
            correlation_id: Some(p.correlation_id.unwrap_or_else(|| parent.id.clone())),
            causation_id: Some(parent.id.clone()),
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
    /// The payload.
    pub payload: Value,
    /// The producer's timestamp, if any.
    pub timestamp: Option<Timestamp>,
}

impl NewEvent {
    /// Applies the append rules: `type` from the payload's `"type"`; `key` from
    /// the option, else the payload's `"key"`; metadata = option metadata merged
    /// with the payload's `"metadata"` object (payload wins); id generated when
    /// absent.
    pub fn prepare(payload: Value, opts: AppendOptions) -> Self {
        let field = |name: &str| payload.get(name).and_then(Value::as_str).map(str::to_owned);
        let event_type = field("type");
        let key = opts.key.or_else(|| field("key"));
        let mut metadata = opts.metadata;
        if let Some(Value::Object(m)) = payload.get("metadata") {
            metadata.extend(m.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        NewEvent {
            id: opts.id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string()),
            key,
            event_type,
            partition: opts.partition,
            metadata,
            payload,
            timestamp: opts.timestamp,
        }
    }

    /// The size this event is charged against the event size limit: the JSON
    /// length of its payload and metadata plus its id, key and type.
    pub fn encoded_len(&self) -> usize {
        self.id.len()
            + self.key.as_ref().map_or(0, String::len)
            + self.event_type.as_ref().map_or(0, String::len)
            + json_len(&self.payload)
            + json_len(&self.metadata)
    }

    /// Turns it into a stored event.
    pub fn into_event(self, stream: &str, partition: u32, sequence: u64, now: Timestamp) -> Event {
        Event {
            id: self.id,
            stream: stream.to_owned(),
            partition,
            sequence,
            timestamp: self.timestamp.unwrap_or(now),
            key: self.key,
            event_type: self.event_type,
            metadata: self.metadata,
            payload: self.payload,
        }
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

    #[test]
    fn prepare_takes_type_key_and_metadata_from_payload() {
        let e = NewEvent::prepare(
            json!({"type": "paid", "key": "k1", "metadata": {"a": 2}, "x": 1}),
            AppendOptions::new().metadata("a", 1).metadata("b", 1),
        );
        assert_eq!(e.event_type.as_deref(), Some("paid"));
        assert_eq!(e.key.as_deref(), Some("k1"));
        assert_eq!(e.metadata.get("a"), Some(&json!(2)));
        assert_eq!(e.metadata.get("b"), Some(&json!(1)));
        assert_eq!(e.payload["x"], json!(1));
        assert_eq!(e.id.len(), 36);
    }

    #[test]
    fn option_key_wins_over_payload_key() {
        let e = NewEvent::prepare(json!({"key": "p"}), AppendOptions::new().key("o"));
        assert_eq!(e.key.as_deref(), Some("o"));
    }

    #[test]
    fn encoded_len_counts_payload_json() {
        let e = NewEvent::prepare(json!("abc"), AppendOptions::new().id("i"));
        assert_eq!(e.encoded_len(), 1 + 5 + 2);
    }

    #[test]
    fn field_paths_resolve() {
        let e = NewEvent::prepare(
            json!({"type": "t", "order": {"customer": {"id": 7}}, "items": [1, 2]}),
            AppendOptions::new().correlation_id("c1").metadata("region", json!({"name": "eu"})),
        )
        .into_event("s", 0, 1, Timestamp::EPOCH);
        assert_eq!(e.field("type"), Some(json!("t")));
        assert_eq!(e.field("order.customer.id"), Some(json!(7)));
        assert_eq!(e.field("payload.items.1"), Some(json!(2)));
        assert_eq!(e.field("correlation_id"), Some(json!("c1")));
        assert_eq!(e.field("metadata.region.name"), Some(json!("eu")));
        assert_eq!(e.field("missing"), None);
    }
}
