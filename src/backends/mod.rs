//! Every backend, one folder each, and the registry that opens one from a
//! URL (ADR 0010).
//!
//! | scheme | backend | feature |
//! |---|---|---|
//! | `memory:` | [`memory::MemoryBackend`]: in-process, ephemeral | always built |
//! | `native:PATH[?options]` | [`native::NativeBackend`]: the embedded log engine | always built |
//! | `sqlite:PATH` | SQLite | `sqlite` (not in this version yet) |
//! | `postgres://…`, `postgresql://…` | PostgreSQL | `postgres` (not in this version yet) |
//! | `mongodb://…`, `mongodb+srv://…` | MongoDB | `mongo` (not in this version yet) |
//! | `redis://…`, `rediss://…` | Redis Streams | `redis` (not in this version yet) |
//!
//! A backend plugs in as a folder here with one arm in `open` (crate-private) behind its
//! cargo feature; the facade ([`crate::Rheo`]) never names a concrete
//! backend.

use std::sync::Arc;

use crate::backend::Backend;
use crate::engine::EngineOptions;
use crate::error::{Error, Result};
use crate::model::time::Clock;

pub mod memory;
pub mod native;

/// What every backend is opened with, besides its URL.
#[derive(Debug, Clone)]
pub(crate) struct OpenContext {
    /// The clock the backend reads.
    pub clock: Arc<dyn Clock>,
}

/// The database backends still to come: (schemes, cargo feature, name).
const PLANNED: [(&[&str], &str, &str); 4] = [
    (&["sqlite"], "sqlite", "SQLite"),
    (&["postgres", "postgresql"], "postgres", "PostgreSQL"),
    (&["mongodb", "mongodb+srv"], "mongo", "MongoDB"),
    (&["redis", "rediss"], "redis", "Redis"),
];

/// Opens the backend a URL names (`scheme:rest`). An unknown scheme is
/// `Error::InvalidArgument` listing the known ones; a known scheme whose backend
/// is not built names the cargo feature it needs.
pub(crate) async fn open(url: &str, cx: &OpenContext) -> Result<Arc<dyn Backend>> {
    let (scheme, rest) = url.split_once(':').unwrap_or((url, ""));
    match scheme {
        "memory" => Ok(Arc::new(memory::MemoryBackend::with_clock(cx.clock.clone()))),
        "native" => {
            let (path, opts) = native::parse_url(rest, EngineOptions::default())?;
            Ok(Arc::new(native::NativeBackend::open(&path, opts, cx.clock.clone()).await?))
        }
        _ => match PLANNED.iter().find(|(schemes, _, _)| schemes.contains(&scheme)) {
            Some((_, feature, name)) => Err(Error::invalid(
                "url",
                format!(
                    "{scheme}: URLs open the {name} backend, which needs the cargo feature {feature:?}; \
                     this version of rheo does not have it yet (available: memory:, native:PATH)"
                ),
            )),
            None => Err(Error::invalid(
                "url",
                format!(
                    "{url:?}: unknown backend scheme {scheme:?}; expected memory:, native:PATH, sqlite:PATH, \
                     postgres://..., mongodb://... or redis://..."
                ),
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::time::SystemClock;

    fn cx() -> OpenContext {
        OpenContext { clock: Arc::new(SystemClock) }
    }

    #[tokio::test]
    async fn schemes_open_their_backend_or_say_what_is_missing() {
        let memory = open("memory:", &cx()).await.expect("memory");
        assert_eq!(memory.capabilities().backend, "memory");
        for (url, feature) in [
            ("postgres://localhost/db", "\"postgres\""),
            ("postgresql://x", "\"postgres\""),
            ("sqlite:./x.db", "\"sqlite\""),
            ("mongodb://h", "\"mongo\""),
            ("redis://h", "\"redis\""),
        ] {
            let Err(e) = open(url, &cx()).await else { panic!("{url}: opened a backend that is not built") };
            assert!(matches!(e, Error::InvalidArgument { .. }), "{url}: {e}");
            assert!(e.to_string().contains(feature), "{url}: {e}");
        }
        let Err(e) = open("kafka://h", &cx()).await else { panic!("opened an unknown scheme") };
        assert!(e.to_string().contains("unknown backend scheme \"kafka\""), "{e}");
        // The native backend's own options are checked before anything opens.
        for (query, says) in [("inline_io=maybe", "expected true or false"), ("colour=red", "unknown native option")] {
            let url = format!("native:./never-created?{query}");
            let Err(e) = open(&url, &cx()).await else { panic!("{url}: opened") };
            assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains(says), "{url}: {e}");
        }
        assert!(!std::path::Path::new("./never-created").exists());
    }
}
