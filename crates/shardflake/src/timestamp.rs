//! Unix milliseconds to and from RFC 3339 text (UTC, millisecond precision).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// First Unix ms of the year 10000, which RFC 3339 cannot write.
pub const YEAR_10000_MS: u64 = 253_402_300_800_000;

/// `2018-06-09T10:00:00.000Z` for 1528538400000; times from the year 10000
/// on (layouts may last that long) as `after 9999 (N ms after 1970)`.
///
/// ```
/// use shardflake::timestamp::rfc3339_ms;
/// assert_eq!(rfc3339_ms(1_528_538_400_000), "2018-06-09T10:00:00.000Z");
/// assert_eq!(rfc3339_ms(u64::MAX), "after 9999 (18446744073709551615 ms after 1970)");
/// ```
pub fn rfc3339_ms(unix_ms: u64) -> String {
    match UNIX_EPOCH.checked_add(Duration::from_millis(unix_ms)) {
        Some(t) if unix_ms < YEAR_10000_MS => humantime::format_rfc3339_millis(t).to_string(),
        _ => format!("after 9999 ({unix_ms} ms after 1970)"),
    }
}

/// Parses RFC 3339 (`2023-01-01T00:00:00Z`) or a plain number of Unix
/// milliseconds.
pub fn parse_unix_ms(text: &str) -> Option<u64> {
    if let Ok(ms) = text.parse::<u64>() {
        return Some(ms);
    }
    let t: SystemTime = humantime::parse_rfc3339_weak(text).ok()?;
    t.duration_since(UNIX_EPOCH)
        .ok()
        .map(|d| d.as_millis() as u64)
}

/// Parses a time as the command line and the service take it, relative to
/// `now_ms`: `now`; a duration before or after now (`-7d`, `+1h`,
/// `now-30m`, `-1h 30m`, in [`humantime`]'s units); RFC 3339; or Unix
/// milliseconds. `None` for anything else or a time before 1970.
///
/// ```
/// use shardflake::timestamp::parse_time;
/// let now = 1_700_000_000_000;
/// assert_eq!(parse_time("now", now), Some(now));
/// assert_eq!(parse_time("-7d", now), Some(now - 7 * 86_400_000));
/// assert_eq!(parse_time("now+1h", now), Some(now + 3_600_000));
/// assert_eq!(parse_time("2014-09-01T00:00:00Z", now), Some(1_409_529_600_000));
/// ```
pub fn parse_time(text: &str, now_ms: u64) -> Option<u64> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let relative = text.strip_prefix("now").unwrap_or(text).trim_start();
    if relative.is_empty() {
        return Some(now_ms);
    }
    let (sign, duration) = if let Some(rest) = relative.strip_prefix('-') {
        (-1, rest)
    } else if let Some(rest) = relative.strip_prefix('+') {
        (1, rest)
    } else if relative.len() == text.len() {
        return parse_unix_ms(text);
    } else {
        return None;
    };
    let ms = u64::try_from(humantime::parse_duration(duration.trim()).ok()?.as_millis()).ok()?;
    if sign < 0 {
        now_ms.checked_sub(ms)
    } else {
        now_ms.checked_add(ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        assert_eq!(rfc3339_ms(1_528_538_400_000), "2018-06-09T10:00:00.000Z");
        assert_eq!(rfc3339_ms(1_288_834_974_657), "2010-11-04T01:42:54.657Z");
        assert_eq!(
            parse_unix_ms("2014-09-01T00:00:00Z"),
            Some(1_409_529_600_000)
        );
        assert_eq!(parse_unix_ms("1409529600000"), Some(1_409_529_600_000));
        assert_eq!(parse_unix_ms("yesterday"), None);
    }

    #[test]
    fn relative_times() {
        let now = 1_700_000_000_000;
        assert_eq!(parse_time(" -1h 30m", now), Some(now - 5_400_000));
        assert_eq!(parse_time("+2w", now), Some(now + 14 * 86_400_000));
        assert_eq!(parse_time("now - 1s", now), Some(now - 1_000));
        assert_eq!(parse_time("1409529600000", now), Some(1_409_529_600_000));
        // Before 1970, not a duration, garbage after now: refused.
        assert_eq!(parse_time("-100000d", 5), None);
        assert_eq!(parse_time("-7 parsecs", now), None);
        assert_eq!(parse_time("nowish", now), None);
        assert_eq!(parse_time("", now), None);
        assert_eq!(parse_time("ü", now), None);
    }
}
