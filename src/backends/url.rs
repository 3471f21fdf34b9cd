//! The options of a backend URL, read one way for every backend (ADR 0027,
//! ADR 0028): an option a user gives is honoured or refused with an error
//! that names it and says what it accepts, never clamped or ignored.
//!
//! A backend hands [`read_options`] its query string and a function that
//! takes the options it knows; what it does not take is either passed on to
//! its driver (a database URL's own options, such as `sslmode`) or refused
//! as unknown, as the backend says.

use std::fmt::Display;
use std::time::Duration;

use crate::error::{Error, Result};

/// One `key=value` option of a URL (a bare `key` has an empty value).
#[derive(Debug, Clone, Copy)]
pub(crate) struct UrlOption<'a> {
    /// The backend's name, as its errors give it.
    pub backend: &'static str,
    pub key: &'a str,
    pub value: &'a str,
}

impl UrlOption<'_> {
    /// The error for this option's value: `why` says what it accepts.
    pub fn refuse(&self, why: impl Display) -> Error {
        Error::invalid("url", format!("{}: option {}={:?}: {why}", self.backend, self.key, self.value))
    }

    /// A whole number within `lo..=hi`.
    pub fn number(&self, lo: u64, hi: u64) -> Result<u64> {
        match self.value.parse::<u64>() {
            Ok(n) if (lo..=hi).contains(&n) => Ok(n),
            _ => Err(self.refuse(format_args!("expected a whole number from {lo} to {hi}"))),
        }
    }

    /// Milliseconds within `lo..=hi`.
    pub fn millis(&self, lo: u64, hi: u64) -> Result<Duration> {
        match self.value.parse::<u64>() {
            Ok(n) if (lo..=hi).contains(&n) => Ok(Duration::from_millis(n)),
            _ => Err(self.refuse(format_args!("expected milliseconds, a whole number from {lo} to {hi}"))),
        }
    }

    /// `true`/`1`/`yes` or `false`/`0`/`no`.
    pub fn boolean(&self) -> Result<bool> {
        match self.value {
            "true" | "1" | "yes" => Ok(true),
            "false" | "0" | "no" => Ok(false),
            _ => Err(self.refuse("expected true or false")),
        }
    }

    /// One of `choices`, by name.
    pub fn choice<T: Copy>(&self, choices: &[(&str, T)]) -> Result<T> {
        match choices.iter().find(|(name, _)| *name == self.value) {
            Some(&(_, v)) => Ok(v),
            None => {
                let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
                Err(self.refuse(format_args!("expected {}", one_of(&names))))
            }
        }
    }

    /// The error for an option the backend does not know; `known` lists
    /// the ones it does.
    pub fn unknown(&self, known: &[&str]) -> Error {
        Error::invalid("url", format!("unknown {} option {:?}; expected {}", self.backend, self.key, one_of(known)))
    }
}

/// `a`, `a or b`, `a, b or c`.
fn one_of(names: &[&str]) -> String {
    match names {
        [] => "none".to_owned(),
        [one] => (*one).to_owned(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// What a backend's option reader does with one option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taken {
    /// The backend took it.
    Yes,
    /// Not the backend's: its driver's (passed on with the URL).
    Driver,
}

/// Reads the `&`-separated options of `query`, handing each to `take`;
/// returns the ones `take` left to the driver, in order, as `key=value`
/// text. An option `take` refuses fails the whole read.
pub(crate) fn read_options<'a>(
    backend: &'static str,
    query: &'a str,
    mut take: impl FnMut(UrlOption<'a>) -> Result<Taken>,
) -> Result<Vec<&'a str>> {
    let mut driver = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if take(UrlOption { backend, key, value })? == Taken::Driver {
            driver.push(pair);
        }
    }
    Ok(driver)
}

/// A database URL without the options a backend took: `base` and the
/// driver's options.
#[cfg_attr(not(any(feature = "mongo", feature = "redis")), allow(dead_code))]
pub(crate) fn driver_url(base: &str, driver: &[&str]) -> String {
    if driver.is_empty() { base.to_owned() } else { format!("{base}?{}", driver.join("&")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(query: &str) -> Result<(Option<u64>, Vec<&str>)> {
        let mut n = None;
        let driver = read_options("test", query, |o| match o.key {
            "rheo_n" => {
                n = Some(o.number(1, 9)?);
                Ok(Taken::Yes)
            }
            k if k.starts_with("rheo_") => Err(o.unknown(&["rheo_n"])),
            _ => Ok(Taken::Driver),
        })?;
        Ok((n, driver))
    }

    #[test]
    fn options_are_taken_passed_on_or_refused_by_name() {
        assert_eq!(read("a=1&rheo_n=3&b").expect("read"), (Some(3), vec!["a=1", "b"]));
        assert_eq!(read("").expect("read"), (None, vec![]));
        for (query, says) in [
            ("rheo_n=0", "test: option rheo_n=\"0\": expected a whole number from 1 to 9"),
            ("rheo_n=10", "from 1 to 9"),
            ("rheo_n=", "rheo_n=\"\""),
            ("rheo_x=1", "unknown test option \"rheo_x\"; expected rheo_n"),
        ] {
            let e = read(query).expect_err(query);
            assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains(says), "{query}: {e}");
        }
    }

    #[test]
    fn values_of_each_kind_are_checked() {
        let o = |value| UrlOption { backend: "t", key: "k", value };
        assert_eq!(o("250").millis(1, 1000).expect("ms"), Duration::from_millis(250));
        assert!(o("0").millis(1, 1000).expect_err("0").to_string().contains("milliseconds, a whole number from 1"));
        assert!(o("yes").boolean().expect("bool") && !o("0").boolean().expect("bool"));
        assert!(o("maybe").boolean().expect_err("maybe").to_string().contains("expected true or false"));
        assert_eq!(o("b").choice(&[("a", 1), ("b", 2)]).expect("choice"), 2);
        let e = o("c").choice(&[("a", 1), ("b", 2), ("d", 4)]).expect_err("c");
        assert!(e.to_string().contains("expected a, b or d"), "{e}");
        assert_eq!(driver_url("h/db", &[]), "h/db");
        assert_eq!(driver_url("h/db", &["x=1", "y"]), "h/db?x=1&y");
    }
}
