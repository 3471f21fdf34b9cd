//! Timestamps and the injectable clock.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// A UTC instant with millisecond precision, stored as milliseconds since the
/// Unix epoch. Displays as RFC 3339 (`2026-11-29T18:14:25.123Z`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// From milliseconds since the Unix epoch.
    pub const fn from_millis(ms: i64) -> Self {
        Timestamp(ms)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// The current system time.
    pub fn now() -> Self {
        Timestamp::from(SystemTime::now())
    }

    /// This instant plus a duration (saturating).
    pub fn saturating_add(self, d: Duration) -> Self {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Timestamp(self.0.saturating_add(ms))
    }

    /// The duration from `earlier` to `self`, zero when `earlier` is later.
    pub fn duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timestamp(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            Err(e) => Timestamp(-i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX)),
        }
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.rem_euclid(1000);
        let secs = self.0.div_euclid(1000);
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        write!(f, "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z", rem / 3600, (rem / 60) % 60, rem % 60)
    }
}

impl std::str::FromStr for Timestamp {
    type Err = crate::Error;

    /// Parses RFC 3339 (`2026-11-29T18:14:25Z`, `2026-11-29T18:14:25.5+01:00`;
    /// `t` or a space may separate date and time), or a date alone
    /// (`2026-11-29`, midnight UTC). Digits past milliseconds are dropped;
    /// a date that does not exist (`2026-02-30`) is refused. The inverse of
    /// `Display` (which always writes UTC with milliseconds).
    ///
    /// ```
    /// use rheo::Timestamp;
    /// let t: Timestamp = "2026-11-29T19:14:25.5+01:00".parse()?;
    /// assert_eq!(t.to_string(), "2026-11-29T18:14:25.500Z");
    /// assert_eq!(t.to_string().parse::<Timestamp>()?, t);
    /// assert!("2026-02-30".parse::<Timestamp>().is_err());
    /// # Ok::<(), rheo::Error>(())
    /// ```
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        rfc3339(s).ok_or_else(|| {
            crate::Error::invalid(
                "timestamp",
                format!(
                    "{s:?} is not an RFC 3339 time (like 2026-11-29T18:14:25Z or 2026-11-29T18:14:25.5+01:00) or date"
                ),
            )
        })
    }
}

fn rfc3339(s: &str) -> Option<Timestamp> {
    let num = |a: usize, b: usize| -> Option<i64> {
        let part = s.get(a..b)?;
        part.bytes().all(|c| c.is_ascii_digit()).then(|| part.parse().ok())?
    };
    let (year, month, day) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    if s.get(4..5)? != "-" || s.get(7..8)? != "-" || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let days = days_from_civil(year, month, day);
    if civil_from_days(days) != (year, month, day) {
        return None;
    }
    if s.len() == 10 {
        return Some(Timestamp(days * 86_400_000));
    }
    if !matches!(s.get(10..11)?, "T" | "t" | " ") || s.get(13..14)? != ":" || s.get(16..17)? != ":" {
        return None;
    }
    let (h, mi, sec) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut rest = s.get(19..)?;
    let mut ms = 0i64;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let first3 = &frac[..digits.min(3)];
        let scale = match first3.len() {
            1 => 100,
            2 => 10,
            _ => 1,
        };
        ms = first3.parse::<i64>().ok()? * scale;
        rest = &frac[digits..];
    }
    let offset_min = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.get(..1)? {
                "+" => 1,
                "-" => -1,
                _ => return None,
            };
            let (oh, om) = (rest.get(1..3)?, rest.get(4..6)?);
            if rest.len() != 6 || rest.get(3..4)? != ":" || !(oh.bytes().chain(om.bytes()).all(|c| c.is_ascii_digit()))
            {
                return None;
            }
            let (oh, om): (i64, i64) = (oh.parse().ok()?, om.parse().ok()?);
            if oh > 23 || om > 59 {
                return None;
            }
            sign * (oh * 60 + om)
        }
    };
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset_min * 60;
    Some(Timestamp(secs * 1000 + ms))
}

/// Howard Hinnant's civil-to-days algorithm, the inverse of
/// `civil_from_days`: days since 1970-01-01 of a proleptic Gregorian date.
pub(crate) fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian calendar).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A source of the current time. Backends read time only through a clock, so
/// tests can move time forward without sleeping.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current instant.
    fn now(&self) -> Timestamp;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that moves only when told to. Cheap to clone; clones share time.
///
/// ```
/// use rheo::{ManualClock, Clock, Timestamp};
/// use std::time::Duration;
///
/// let clock = ManualClock::new(Timestamp::from_millis(1_000));
/// clock.advance(Duration::from_secs(30));
/// assert_eq!(clock.now(), Timestamp::from_millis(31_000));
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    ms: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: Timestamp) -> Self {
        ManualClock { ms: Arc::new(AtomicI64::new(start.as_millis())) }
    }

    /// Moves the clock forward.
    pub fn advance(&self, d: Duration) {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        self.ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock to an instant (which may be in its past).
    pub fn set(&self, t: Timestamp) {
        self.ms.store(t.as_millis(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.ms.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_rfc3339() {
        assert_eq!(Timestamp::EPOCH.to_string(), "1970-01-01T00:00:00.000Z");
        assert_eq!(Timestamp::from_millis(1_795_911_265_123).to_string(), "2026-11-29T00:14:25.123Z");
        assert_eq!(Timestamp::from_millis(951_782_400_000).to_string(), "2000-02-29T00:00:00.000Z");
        assert_eq!(Timestamp::from_millis(-1).to_string(), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn parses_rfc3339_and_dates_and_refuses_the_rest() {
        let ok = |s: &str| s.parse::<Timestamp>().unwrap_or_else(|e| panic!("{s}: {e}")).as_millis();
        assert_eq!(ok("1970-01-01T00:00:01Z"), 1000);
        assert_eq!(ok("1970-01-01t01:00:01.5+01:00"), 1500);
        assert_eq!(ok("1970-01-01 00:00:00.123456z"), 123);
        assert_eq!(ok("1969-12-31T19:00:00-05:00"), 0);
        assert_eq!(ok("2000-02-29"), 951_782_400_000);
        for t in [Timestamp::EPOCH, Timestamp::from_millis(1_795_911_265_123), Timestamp::from_millis(-1)] {
            assert_eq!(t.to_string().parse::<Timestamp>().expect("round trip"), t);
        }
        for bad in [
            "",
            "2026",
            "2026-13-01",
            "2026-02-30",
            "2026-00-10",
            "2026-11-29T24:00:00Z",
            "2026-11-29T18:14:25",
            "2026-11-29T18:14:25.Z",
            "2026-11-29T18:14:25+1:00",
            "2026-11-29T18:14:25+01:60",
            "2026-11-29T18:14:25+0a:00",
            "2026-11-29X18:14:25Z",
            "+2026-11-29",
            "yesterday",
        ] {
            match bad.parse::<Timestamp>() {
                Err(crate::Error::InvalidArgument { argument: "timestamp", reason }) => {
                    assert!(reason.contains(&format!("{bad:?}")), "{reason}");
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn arithmetic_saturates() {
        let t = Timestamp::from_millis(i64::MAX - 1);
        assert_eq!(t.saturating_add(Duration::from_secs(10)).as_millis(), i64::MAX);
        assert_eq!(Timestamp::EPOCH.duration_since(Timestamp::from_millis(5)), Duration::ZERO);
    }
}
