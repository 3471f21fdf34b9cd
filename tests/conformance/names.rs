//! Names: non-empty UTF-8, at most 255 bytes, no NUL or control characters;
//! anything else is `InvalidName`, and a path-like name is just a name.

use rheo::{AppendOptions, Error, FetchOptions, GroupOptions, ObjectKind, StreamOptions};
use serde_json::json;

use crate::common::Fixture;
use crate::support::*;

/// An empty stream name is `InvalidName` for every operation that takes one.
pub async fn empty_stream_name_is_invalid_name(f: Fixture) {
    let e = assert_err!(
        f.rheo.create_stream("", StreamOptions::new()).await,
        Error::InvalidName { kind: ObjectKind::Stream, .. }
    );
    assert_mentions(&e, &["stream"]);
    assert_err!(f.rheo.append("", &json!({}), AppendOptions::new()).await, Error::InvalidName { .. });
    assert_err!(f.rheo.read("", 0, 0, 10).await, Error::InvalidName { .. });
    assert_err!(f.rheo.create_group("", G, GroupOptions::new()).await, Error::InvalidName { .. });
    assert!(f.rheo.list_streams().await.expect("list streams").is_empty(), "nothing was created");
}

/// A name of 256 bytes is `InvalidName`; 255 bytes is fine. Bytes count, not characters.
pub async fn stream_name_over_255_bytes_is_invalid_name(f: Fixture) {
    let too_long = "x".repeat(256);
    let e = assert_err!(
        f.rheo.create_stream(&too_long, StreamOptions::new()).await,
        Error::InvalidName { kind: ObjectKind::Stream, .. }
    );
    assert_mentions(&e, &["xxxxxxxx"]);
    // 128 two-byte characters: 256 bytes.
    assert_err!(f.rheo.create_stream(&"é".repeat(128), StreamOptions::new()).await, Error::InvalidName { .. });

    let longest = "x".repeat(255);
    f.rheo.create_stream(&longest, StreamOptions::new()).await.expect("255 bytes is a valid name");
    let multibyte = format!("{}x", "é".repeat(127));
    assert_eq!(multibyte.len(), 255);
    f.rheo.create_stream(&multibyte, StreamOptions::new()).await.expect("255 bytes of UTF-8 is a valid name");
    let names: Vec<String> = f.rheo.list_streams().await.expect("list").into_iter().map(|s| s.name).collect();
    assert_eq!(names.len(), 2);
    assert!(names.contains(&longest) && names.contains(&multibyte));
}

/// NUL and every other control character make a name `InvalidName`, and the
/// message names the rejected value.
pub async fn names_with_nul_or_control_chars_are_invalid_name(f: Fixture) {
    for bad in ["bad\0name", "bad\nname", "bad\tname", "bad\rname", "bad\u{1b}name", "bad\u{7f}name", "bad\u{85}name"] {
        let e = assert_err!(
            f.rheo.create_stream(bad, StreamOptions::new()).await,
            Error::InvalidName { kind: ObjectKind::Stream, .. }
        );
        assert_mentions(&e, &["bad", "name"]);
    }
    assert!(f.rheo.list_streams().await.expect("list").is_empty());
}

/// Group names follow the same rules and are reported as group names.
pub async fn group_names_follow_the_name_rules(f: Fixture) {
    stream(&f, 1).await;
    for bad in [String::new(), "g".repeat(256), "g\0".to_owned(), "g\u{1}".to_owned()] {
        let e = assert_err!(
            f.rheo.create_group(S, &bad, GroupOptions::new()).await,
            Error::InvalidName { kind: ObjectKind::Group, .. }
        );
        assert_mentions(&e, &["group"]);
        assert_err!(
            f.rheo.fetch(S, &bad, FetchOptions::new()).await,
            Error::InvalidName { kind: ObjectKind::Group, .. }
        );
    }
    assert!(f.rheo.list_groups(S).await.expect("list groups").is_empty());
}

/// A consumer id is a name too: an invalid one is `InvalidName` and claims nothing.
pub async fn consumer_id_follows_the_name_rules(f: Fixture) {
    setup(&f, 1).await;
    append_to(&f, 0, 1).await;
    for bad in ["", "worker\0"] {
        assert_err!(
            f.rheo.fetch(S, G, FetchOptions::new().consumer(bad)).await,
            Error::InvalidName { kind: ObjectKind::Consumer, .. }
        );
    }
    let leases = fetch(&f, 10).await;
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].attempt, 1, "the rejected fetches claimed nothing");
}

/// Path-like names are plain names: they are accepted and kept exactly.
pub async fn path_like_names_are_plain_names(f: Fixture) {
    for name in ["../../etc", "../../etc/passwd", "a/b", "..", ".", "C:\\temp", "orders.v2", "ключ"] {
        f.rheo.create_stream(name, StreamOptions::new()).await.unwrap_or_else(|e| panic!("{name:?}: {e}"));
        let event = f.rheo.append(name, &json!({"n": 1}), AppendOptions::new()).await.expect("append");
        assert_eq!(event.stream(), name);
        f.rheo.create_group(name, "../group", GroupOptions::new()).await.expect("path-like group name");
        let leases = f.rheo.fetch(name, "../group", FetchOptions::new()).await.expect("fetch");
        assert_eq!(leases.len(), 1);
        assert_eq!(f.rheo.read(name, 0, 0, 10).await.expect("read"), vec![event]);
    }
    let names: Vec<String> = f.rheo.list_streams().await.expect("list").into_iter().map(|s| s.name).collect();
    assert_eq!(names.len(), 8);
    assert!(names.iter().any(|n| n == "../../etc"));
}
