//! `Accept` negotiation for the history route (RFC 9110, 12.5.1): JSON or
//! the bare `text` rendering.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};

use super::error::{ApiError, ProblemCode};

/// What the caller takes: the JSON document, or the rendering as text/plain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    Json,
    PlainText,
}

impl<S: Send + Sync> FromRequestParts<S> for Body {
    type Rejection = ApiError;

    /// By quality, then by the range that named it (`text/plain, */*` is
    /// text); JSON on a tie. 406 when `Accept` rules out both.
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let json = quality(&parts.headers, "application/json");
        let text = quality(&parts.headers, "text/plain");
        if json.0 <= 0.0 && text.0 <= 0.0 {
            return Err(ProblemCode::NotAcceptable.into());
        }
        Ok(
            if text.0 > json.0 || (text.0 == json.0 && text.1 > json.1) {
                Body::PlainText
            } else {
                Body::Json
            },
        )
    }
}

/// The quality `Accept` gives a media type: that of the most specific range
/// matching it (`type/subtype` 3, over `type/*` 2, over `*/*` 1), with that
/// specificity; (0, 0) if none does, (1, 0) with no `Accept` at all. A range
/// with a malformed `q` is ignored.
fn quality(headers: &HeaderMap, media: &str) -> (f32, u8) {
    let (kind, _) = media.split_once('/').unwrap_or((media, ""));
    let mut ranges = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter(|r| !r.trim().is_empty())
        .peekable();
    if ranges.peek().is_none() {
        return (1.0, 0);
    }
    let mut best: Option<(u8, f32)> = None;
    for range in ranges {
        let mut parts = range.split(';');
        let name = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
        let specificity = if name == media {
            3
        } else if name.strip_suffix("/*") == Some(kind) {
            2
        } else if name == "*/*" {
            1
        } else {
            continue;
        };
        let q = parts
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
            .map_or(Some(1.0), |(_, v)| {
                v.trim()
                    .parse::<f32>()
                    .ok()
                    .filter(|q| (0.0..=1.0).contains(q))
            });
        let Some(q) = q else { continue };
        if best.is_none_or(|(s, _)| specificity > s) {
            best = Some((specificity, q));
        }
    }
    best.map_or((0.0, 0), |(s, q)| (q, s))
}
