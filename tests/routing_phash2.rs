//! Key routing matches `erlang:phash2/1,2` on binaries, vector by vector
//! (generated with Erlang/OTP 25; see `tests/data/phash2.jsonl`).

use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Deserialize)]
struct Vector {
    key_hex: String,
    phash2: u32,
    #[serde(rename = "mod")]
    modulo: BTreeMap<String, u32>,
}

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length in {s:?}");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit")).collect()
}

#[test]
fn every_vector_routes_like_erlang() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/phash2.jsonl"))
        .expect("vector file present");
    let mut lines = 0;
    let mut checks = 0;
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: Vector = serde_json::from_str(line).unwrap_or_else(|e| panic!("line {}: {e}", n + 1));
        let key = unhex(&v.key_hex);
        assert_eq!(rheo::phash2(&key), v.phash2, "phash2 of key {} (line {})", v.key_hex, n + 1);
        for (range, expected) in &v.modulo {
            let range: u32 = range.parse().expect("numeric range");
            assert_eq!(rheo::phash2_range(&key, range), *expected, "phash2({}, {range}) (line {})", v.key_hex, n + 1);
            if let Ok(text_key) = std::str::from_utf8(&key) {
                assert_eq!(rheo::partition_for_key(text_key, range), *expected);
            }
            checks += 1;
        }
        lines += 1;
    }
    assert!(lines >= 50, "expected the whole vector file, decoded {lines} lines");
    assert!(checks >= 400, "expected every range of every line, checked {checks}");
}
