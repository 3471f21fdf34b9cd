//! What the `rheo` command shares with `rheo-bench`: the error a command
//! fails with ([`error::CliError`]) and how a command prints its result
//! ([`output`]: JSON under `--json`, tables and lines for people). Not an
//! API: it changes with the command.

#![deny(clippy::unwrap_used)]

pub mod error;
pub mod output;
