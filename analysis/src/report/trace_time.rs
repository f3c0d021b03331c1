//! A moment of a trace as `report --from` and `--to` take it: a time
//! after the trace's start (`90`, `1.5m`, `250ms`) or on the wall clock
//! (`2026-11-29T13:05:00`, `2026-11-29 13:05:00+01:00`, `@1795957500`),
//! placed in the trace by its header's start (CLOCK_REALTIME).

use std::str::FromStr;

use jiff::{civil, tz::TimeZone, Timestamp};

/// A moment of a trace, as given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceTime {
    /// ns after the trace's start.
    Since(u64),
    /// A wall-clock time, ns since the Unix epoch.
    At(i128),
}

impl TraceTime {
    /// ns after a trace's start at `start_realtime_ns` (the header's
    /// CLOCK_REALTIME, ns since the Unix epoch). Fails, saying when the
    /// trace started, for a wall-clock time before that.
    pub fn since_start(self, start_realtime_ns: u64) -> Result<u64, String> {
        match self {
            TraceTime::Since(ns) => Ok(ns),
            TraceTime::At(at) => {
                let d = at - i128::from(start_realtime_ns);
                u64::try_from(d)
                    .map_err(|_| format!("before the trace's start ({})", TraceTime::At(i128::from(start_realtime_ns))))
            }
        }
    }
}

impl std::fmt::Display for TraceTime {
    /// As given: seconds after the start, or the time in this machine's zone.
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match *self {
            TraceTime::Since(ns) => write!(f, "{:.3} s", ns as f64 / 1e9),
            TraceTime::At(at) => match Timestamp::from_nanosecond(at) {
                Ok(t) => write!(f, "{}", t.to_zoned(TimeZone::system()).strftime("%Y-%m-%d %H:%M:%S%.3f %Z")),
                Err(_) => write!(f, "@{}", at / 1_000_000_000),
            },
        }
    }
}

/// Parses `--from`/`--to`: a duration after the trace's start
/// ([`super::parse_duration`]: `90`, `1.5m`, `250ms`), or a wall-clock
/// time: RFC 3339 with its offset (`2026-11-29T13:05:00Z`), a date and
/// time in this machine's time zone (`2026-11-29 13:05:00`, seconds and
/// their fraction optional; jiff reads the zone from `TZ` or
/// /etc/localtime), or `@SECONDS` since the Unix epoch.
pub fn parse_trace_time(s: &str) -> Result<TraceTime, String> {
    let s = s.trim();
    if let Some(secs) = s.strip_prefix('@') {
        // Read exactly (an f64 of ns since the epoch is off by up to 256).
        let bad = || format!("{s:?}: @ and seconds since the Unix epoch (like @1795957500 or @1795957500.25)");
        let (whole, frac) = secs.split_once('.').unwrap_or((secs, ""));
        let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
        if !digits(whole) || !(frac.is_empty() || digits(frac) && frac.len() <= 9) {
            return Err(bad());
        }
        let ns: i128 = format!("{frac:0<9}").parse().map_err(|_| bad())?;
        return Ok(TraceTime::At(whole.parse::<i128>().map_err(|_| bad())? * 1_000_000_000 + ns));
    }
    // A date is YYYY-…: a duration never has a '-' after its digits.
    if s.get(4..5).is_none_or(|c| c != "-") {
        return super::parse_duration(s).map(TraceTime::Since);
    }
    let at = match Timestamp::from_str(s) {
        Ok(t) => t,
        Err(_) => civil::DateTime::from_str(s)
            .and_then(|d| d.to_zoned(TimeZone::system()))
            .map(|z| z.timestamp())
            .map_err(|e| {
                format!(
                    "{s:?} is not a time (like 90s after the start, or 2026-11-29 13:05:00, 2026-11-29T13:05:00Z): {e}"
                )
            })?,
    };
    Ok(TraceTime::At(at.as_nanosecond()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_wall_clock_times() {
        assert_eq!(parse_trace_time("1.5m"), Ok(TraceTime::Since(90_000_000_000)));
        assert_eq!(parse_trace_time("250ms"), Ok(TraceTime::Since(250_000_000)));
        // 2026-11-29T13:05:00Z is 1,795,957,500 s after the epoch.
        let at = TraceTime::At(1_795_957_500_000_000_000);
        assert_eq!(parse_trace_time("2026-11-29T13:05:00Z"), Ok(at));
        assert_eq!(parse_trace_time("2026-11-29T14:05:00+01:00"), Ok(at));
        assert_eq!(parse_trace_time("@1795957500"), Ok(at));
        assert_eq!(parse_trace_time("@1795957500.000000123"), Ok(TraceTime::At(1_795_957_500_000_000_123)));
        assert!(parse_trace_time("@17.5.1").is_err() && parse_trace_time("@").is_err());
        assert!(parse_trace_time("2026-13-29 13:05").is_err());
        assert!(parse_trace_time("soon").is_err());
        // Placed in a trace that started 2 s before.
        let start = 1_795_957_498_000_000_000;
        assert_eq!(at.since_start(start), Ok(2_000_000_000));
        assert_eq!(TraceTime::Since(7).since_start(start), Ok(7));
        let before = at.since_start(start + 3_000_000_000).unwrap_err();
        assert!(before.starts_with("before the trace's start (2026-11-29 "), "{before}");
    }
}
