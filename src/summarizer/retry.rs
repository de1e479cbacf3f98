//! When to try again and how long to wait first. Pure (the jitter is passed
//! in), so the bounds are tested without sleeping.

use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime};

use http::HeaderMap;

/// The longest single wait between attempts, backoff or `Retry-After`. An
/// endpoint that asks for more is given up on: retrying sooner than it
/// allows only earns another 429, and a later finalize triggers a new try.
pub const WAIT_CAP: Duration = Duration::from_secs(20);

/// The most any `summarize` call may take, whatever the settings, so a
/// summarization lock can always outlive it.
pub const TOTAL_CAP: Duration = Duration::from_secs(600);

/// The time bound of one `summarize` call: every attempt at its full timeout
/// and every wait at its cap, no more than [`TOTAL_CAP`].
pub fn total_bound(timeout: Duration, max_retries: u32) -> Duration {
    let attempts = timeout.saturating_mul(max_retries.saturating_add(1));
    attempts
        .saturating_add(WAIT_CAP.saturating_mul(max_retries))
        .min(TOTAL_CAP)
}

/// The wait before retry number `retry` (0 for the first): `base × 2^retry`,
/// capped at [`WAIT_CAP`], of which a random half (`jitter` in [0, 1)) is
/// dropped so that instances failing together do not retry together.
pub fn backoff(base: Duration, retry: u32, jitter: f64) -> Duration {
    let full = base
        .saturating_mul(2u32.saturating_pow(retry.min(31)))
        .min(WAIT_CAP);
    let half = full / 2;
    half + half.mul_f64(jitter.clamp(0.0, 1.0))
}

/// A number in [0, 1) that differs between calls, from the standard
/// library's randomly keyed hasher: jitter needs no stronger source, nor a
/// dependency.
pub fn jitter() -> f64 {
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// How long a 429 or 5xx answer asks to wait: `retry-after-ms` (sent by
/// OpenAI, finer) or `Retry-After` in seconds or as an HTTP date.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return seconds(ms / 1000.0);
    }
    let value = header("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return seconds(secs);
    }
    let date = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let at = SystemTime::from(date);
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

fn seconds(secs: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(secs).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn backoff_doubles_within_its_jitter_and_stops_at_the_cap() {
        let base = Duration::from_millis(100);
        assert_eq!(backoff(base, 0, 0.0), Duration::from_millis(50));
        assert_eq!(backoff(base, 0, 0.5), Duration::from_millis(75));
        assert!(backoff(base, 0, 0.999_999) < base);
        assert_eq!(backoff(base, 3, 0.0), Duration::from_millis(400));
        assert_eq!(backoff(base, 60, 1.0), WAIT_CAP);
        assert_eq!(backoff(Duration::MAX, 1, 1.0), WAIT_CAP);
    }

    #[test]
    fn jitter_is_in_the_unit_interval_and_varies() {
        let draws: Vec<f64> = (0..100).map(|_| jitter()).collect();
        assert!(draws.iter().all(|j| (0.0..1.0).contains(j)));
        assert!(draws.iter().any(|j| *j != draws[0]));
    }

    #[test]
    fn the_total_bound_covers_every_attempt_and_wait_up_to_the_cap() {
        let second = Duration::from_secs(1);
        assert_eq!(total_bound(second, 0), second);
        assert_eq!(total_bound(second, 2), 3 * second + 2 * WAIT_CAP);
        assert_eq!(total_bound(Duration::from_secs(120), 10), TOTAL_CAP);
        assert_eq!(total_bound(Duration::MAX, u32::MAX), TOTAL_CAP);
    }

    #[test]
    fn retry_after_takes_milliseconds_seconds_or_a_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480); // 2015-10-21 07:28:00 UTC
        let wait = |pairs| retry_after(&headers(pairs), now);
        assert_eq!(wait(&[("retry-after", "3")]), Some(Duration::from_secs(3)));
        assert_eq!(
            wait(&[("retry-after", " 1.5 ")]),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            wait(&[("retry-after", "2"), ("retry-after-ms", "250")]),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            wait(&[("retry-after", "Wed, 21 Oct 2015 07:28:10 GMT")]),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            wait(&[("retry-after", "Wed, 21 Oct 2015 07:27:00 GMT")]),
            Some(Duration::ZERO)
        );
        assert_eq!(wait(&[("retry-after", "-1")]), None);
        assert_eq!(wait(&[("retry-after", "soon")]), None);
        assert_eq!(wait(&[]), None);
    }
}
