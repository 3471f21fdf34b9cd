//! Index terms: canonical field paths and typed, order-preserving value keys.
//!
//! A value key is a type tag and bytes whose byte order is the value order
//! of [`compare_values`](crate::model::query::compare_values) within the
//! type (see `format/secondary-index.md`, "Value keys"):
//!
//! | tag | type | bytes |
//! |---|---|---|
//! | `0x00` | null | none |
//! | `0x01` | boolean | `0x00` false, `0x01` true |
//! | `0x02` | number | a class byte, then the value (below) |
//! | `0x03` | string | its UTF-8 bytes |
//! | `0x04` | array or object | none: only says the field is present |
//!
//! Numbers: class `0x01` holds every value whose integral part fits in
//! `i128` (every integer, every float below 2^127 in magnitude): the
//! integral part `floor(v)` as 16 big-endian bytes with the sign bit
//! flipped, followed, for a value with a fraction, by the fraction's `f64`
//! bits (8 big-endian bytes; a fraction is in (0, 1], so its bits order as
//! its value). Integers and integral floats share a key (`1 == 1.0`).
//! The fraction `v - floor(v)` is exact except for `v` in (−1, 0), where
//! `v + 1` is rounded: there distinct values may share a key (the order is
//! kept, not made strict), so bounds at such values include their key.
//! Classes `0x00` and `0x02` hold floats below and above that range as
//! order-preserving `f64` bits.

use std::ops::Bound;

use serde_json::Value;

/// Tag of a null value.
pub const TAG_NULL: u8 = 0x00;
/// Tag of a boolean.
pub const TAG_BOOL: u8 = 0x01;
/// Tag of a number.
pub const TAG_NUMBER: u8 = 0x02;
/// Tag of a string.
pub const TAG_STRING: u8 = 0x03;
/// Tag of an array or object (presence only).
pub const TAG_OTHER: u8 = 0x04;

/// Number class: a float below `i128::MIN`.
const CLASS_LOW: u8 = 0x00;
/// Number class: the integral part fits in `i128`.
const CLASS_INT: u8 = 0x01;
/// Number class: a float above `i128::MAX`.
const CLASS_HIGH: u8 = 0x02;

/// Beyond this magnitude `compare_values` compares integers with floats
/// through `f64`, which is not transitive: lookups widen their bounds.
const EXACT_LIMIT: f64 = 9_007_199_254_740_992.0; // 2^53

pub use crate::model::query::ALWAYS_INDEXED;

pub use crate::model::path::canonical_path as canonical;

pub use crate::msgpack::Scalar;

/// The key of a scalar (see the module docs).
pub fn scalar_key(s: &Scalar<'_>, out: &mut Vec<u8>) {
    match *s {
        Scalar::Null => out.push(TAG_NULL),
        Scalar::Bool(b) => out.extend_from_slice(&[TAG_BOOL, u8::from(b)]),
        Scalar::Int(i) => {
            out.extend_from_slice(&[TAG_NUMBER, CLASS_INT]);
            out.extend_from_slice(&flip(i));
        }
        Scalar::Float(f) => float_key(f, out),
        Scalar::Str(b) => {
            out.push(TAG_STRING);
            out.extend_from_slice(b);
        }
        Scalar::Other => out.push(TAG_OTHER),
    }
}

fn flip(i: i128) -> [u8; 16] {
    ((i as u128) ^ (1u128 << 127)).to_be_bytes()
}

/// Order-preserving bits of a finite f64.
fn f64_order(f: f64) -> [u8; 8] {
    let b = f.to_bits();
    let o = if b >> 63 == 1 { !b } else { b | (1 << 63) };
    o.to_be_bytes()
}

#[allow(clippy::cast_possible_truncation)]
fn float_key(f: f64, out: &mut Vec<u8>) {
    if !f.is_finite() {
        out.push(TAG_NULL);
        return;
    }
    out.push(TAG_NUMBER);
    // 2^127 as f64 is exact; i128 covers [-2^127, 2^127).
    let limit = 170_141_183_460_469_231_731_687_303_715_884_105_728.0_f64;
    if f < -limit {
        out.push(CLASS_LOW);
        out.extend_from_slice(&f64_order(f));
    } else if f >= limit {
        out.push(CLASS_HIGH);
        out.extend_from_slice(&f64_order(f));
    } else {
        let int = f.floor();
        out.push(CLASS_INT);
        // In range by the checks above: the cast is exact.
        out.extend_from_slice(&flip(int as i128));
        let frac = f - int;
        if frac > 0.0 {
            out.extend_from_slice(&frac.to_bits().to_be_bytes());
        }
    }
}

/// The scalar a JSON value is, as the index sees it.
pub fn json_scalar(v: &Value) -> Scalar<'_> {
    match v {
        Value::Null => Scalar::Null,
        Value::Bool(b) => Scalar::Bool(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Scalar::Int(i128::from(i))
            } else if let Some(u) = n.as_u64() {
                Scalar::Int(i128::from(u))
            } else {
                n.as_f64().map_or(Scalar::Null, Scalar::Float)
            }
        }
        Value::String(s) => Scalar::Str(s.as_bytes()),
        Value::Array(_) | Value::Object(_) => Scalar::Other,
    }
}

/// The key of a JSON value.
pub fn json_key(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    scalar_key(&json_scalar(v), &mut out);
    out
}

/// A range of value keys, both ends as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRange {
    /// The lower end.
    pub lo: Bound<Vec<u8>>,
    /// The upper end.
    pub hi: Bound<Vec<u8>>,
}

impl KeyRange {
    /// Exactly one key.
    pub fn point(k: Vec<u8>) -> Self {
        KeyRange { lo: Bound::Included(k.clone()), hi: Bound::Included(k) }
    }

    /// Every key of a type.
    pub fn tag(tag: u8) -> Self {
        let hi = match tag.checked_add(1) {
            Some(next) => Bound::Excluded(vec![next]),
            None => Bound::Unbounded,
        };
        KeyRange { lo: Bound::Included(vec![tag]), hi }
    }

    /// Every key.
    pub fn all() -> Self {
        KeyRange { lo: Bound::Unbounded, hi: Bound::Unbounded }
    }

    /// True when `k` is in the range.
    pub fn contains(&self, k: &[u8]) -> bool {
        let above = match &self.lo {
            Bound::Included(lo) => k >= lo.as_slice(),
            Bound::Excluded(lo) => k > lo.as_slice(),
            Bound::Unbounded => true,
        };
        let below = match &self.hi {
            Bound::Included(hi) => k <= hi.as_slice(),
            Bound::Excluded(hi) => k < hi.as_slice(),
            Bound::Unbounded => true,
        };
        above && below
    }

    /// True when every key in the range is the same single key.
    pub fn is_point(&self) -> bool {
        matches!((&self.lo, &self.hi), (Bound::Included(a), Bound::Included(b)) if a == b)
    }
}

/// How a comparison reads an index: the value-key ranges whose union holds
/// (at least) every matching value. `None`: the index cannot narrow it.
pub fn ranges(op: &crate::model::query::Op) -> Option<Vec<KeyRange>> {
    use crate::model::query::Op;
    match op {
        Op::Eq(v) => Some(vec![equal(v)]),
        Op::In(vs) => Some(vs.iter().map(equal).collect()),
        Op::Gt(v) => Some(bound(v, false, true)),
        Op::Gte(v) => Some(bound(v, true, true)),
        Op::Lt(v) => Some(bound(v, false, false)),
        Op::Lte(v) => Some(bound(v, true, false)),
        Op::Exists(true) => Some(vec![KeyRange::all()]),
        Op::Exists(false) => None,
    }
}

/// Numbers too large for exact mixed comparison, as the f64 they compare as.
fn inexact(v: &Value) -> Option<f64> {
    let f = v.as_f64()?;
    (f.abs() >= EXACT_LIMIT).then_some(f)
}

/// The keys of every number within a few `f64` steps of `f` (a superset of
/// the values `compare_values` may find equal to it).
fn widened(f: f64) -> (Vec<u8>, Vec<u8>) {
    let (mut lo, mut hi) = (f, f);
    for _ in 0..2 {
        lo = lo.next_down();
        hi = hi.next_up();
    }
    let (mut a, mut b) = (Vec::new(), Vec::new());
    float_key(lo, &mut a);
    float_key(hi, &mut b);
    (a, b)
}

fn equal(v: &Value) -> KeyRange {
    match inexact(v) {
        Some(f) => {
            let (lo, hi) = widened(f);
            KeyRange { lo: Bound::Included(lo), hi: Bound::Included(hi) }
        }
        None => KeyRange::point(json_key(v)),
    }
}

/// True for a float in (−1, 0): its fraction `v + 1` is rounded to an
/// `f64`, so values near it may have the same key (−1e-300 and −1e-200 both
/// have the fraction 1.0; −0.3 and −0.30000000000000004 both 0.7). A bound
/// at it must include its key, or it misses them.
fn shares_key(v: &Value) -> bool {
    v.as_f64().is_some_and(|f| -1.0 < f && f < 0.0)
}

/// Values above (`upward`) or below `v`, `inclusive` or not, of its type.
fn bound(v: &Value, inclusive: bool, upward: bool) -> Vec<KeyRange> {
    let tag = match v {
        Value::Array(_) | Value::Object(_) => {
            // Only equal arrays/objects compare, as Equal.
            return if inclusive { vec![KeyRange::tag(TAG_OTHER)] } else { Vec::new() };
        }
        Value::Null => return if inclusive { vec![KeyRange::point(vec![TAG_NULL])] } else { Vec::new() },
        Value::Bool(_) => TAG_BOOL,
        Value::Number(_) => TAG_NUMBER,
        Value::String(_) => TAG_STRING,
    };
    let whole = KeyRange::tag(tag);
    let (at, inclusive) = match inexact(v) {
        Some(f) => {
            let (lo, hi) = widened(f);
            (if upward { lo } else { hi }, true)
        }
        None => (json_key(v), inclusive || shares_key(v)),
    };
    let at = if inclusive { Bound::Included(at) } else { Bound::Excluded(at) };
    vec![if upward { KeyRange { lo: at, hi: whole.hi } } else { KeyRange { lo: whole.lo, hi: at } }]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::query::compare_values;
    use serde_json::json;
    use std::cmp::Ordering;

    #[test]
    fn canonical_paths() {
        assert_eq!(canonical("currency").as_deref(), Some("payload.currency"));
        assert_eq!(canonical("payload.currency").as_deref(), Some("payload.currency"));
        assert_eq!(canonical("metadata.producer").as_deref(), Some("producer"));
        assert_eq!(canonical("metadata.x.y").as_deref(), Some("metadata.x.y"));
        assert_eq!(canonical("id").as_deref(), Some("id"));
        assert_eq!(canonical("sequence"), None);
    }

    #[test]
    fn key_order_is_value_order_within_a_type() {
        let values = [
            json!(-1e300),
            json!(i64::MIN),
            json!(-2.5),
            json!(-2),
            json!(-1.5),
            json!(0),
            json!(0.25),
            json!(1),
            json!(1.5),
            json!(2),
            json!(1u64 << 53),
            json!(u64::MAX),
            json!(1e30),
            json!(1e300),
        ];
        for a in &values {
            for b in &values {
                let by_key = json_key(a).cmp(&json_key(b));
                assert_eq!(Some(by_key), compare_values(a, b), "{a} vs {b}");
            }
        }
        assert_eq!(json_key(&json!(1)), json_key(&json!(1.0)));
        assert_ne!(json_key(&json!(1)), json_key(&json!("1")));
        assert!(json_key(&json!("a")) < json_key(&json!("ab")));
        assert!(json_key(&json!(false)) < json_key(&json!(true)));
    }

    #[test]
    fn big_numbers_widen_to_a_superset() {
        let big = (1i64 << 53) + 1;
        let r = equal(&json!((1i64 << 53) as f64));
        // 2^53 + 1 compares equal to the float 2^53: its key must be inside.
        assert_eq!(compare_values(&json!(big), &json!((1i64 << 53) as f64)), Some(Ordering::Equal));
        assert!(r.contains(&json_key(&json!(big))));
        assert!(r.contains(&json_key(&json!(1i64 << 53))));
    }

    #[test]
    fn bounds_at_floats_in_minus_one_to_zero_include_values_sharing_their_key() {
        use crate::model::query::Op;
        let values = [-1e-300, -1e-200, -0.3, -0.30000000000000004, -0.25, -0.24999999999999997, -0.75, -1.0, 0.0];
        // Distinct values, one key: the fraction v + 1 rounds to 1.0 (or 0.7).
        assert_eq!(json_key(&json!(-1e-300)), json_key(&json!(-1e-200)));
        let mut minus_tiny = vec![TAG_NUMBER, CLASS_INT, 0x7f];
        minus_tiny.extend_from_slice(&[0xff; 15]);
        minus_tiny.extend_from_slice(&1.0f64.to_bits().to_be_bytes());
        assert_eq!(json_key(&json!(-1e-300)), minus_tiny, "the spec's example");
        assert_eq!(json_key(&json!(-0.3)), json_key(&json!(-0.30000000000000004)));
        for a in values.map(|a| json!(a)) {
            let event = crate::Event::from(crate::EventParts {
                payload: json!({"n": a}).into(),
                ..crate::EventParts::new("s", 0, 1)
            });
            for b in values.map(|b| json!(b)) {
                for op in [Op::Gt(b.clone()), Op::Gte(b.clone()), Op::Lt(b.clone()), Op::Lte(b.clone()), Op::Eq(b)] {
                    let filter = crate::model::query::Filter { path: "n".into(), op };
                    if filter.matches(&event) {
                        let rs = ranges(&filter.op).expect("indexable");
                        assert!(rs.iter().any(|r| r.contains(&json_key(&a))), "{a} matches {:?}", filter.op);
                    }
                }
            }
        }
    }
}
