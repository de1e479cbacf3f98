//! The lens: an inspector page at `/lens` (`TURNSTORE_LENS`) that shows
//! what a prompt receives. Its files (`lens/` in the repository) are
//! built into the binary; the page reads through the public API, with the
//! API's keys, so what it shows is what clients get, and masks secrets
//! before showing anything (`redact.rs`'s rules, which it receives in the
//! page: the built-in ones and `TURNSTORE_REDACT_PATTERNS`').
//!
//! Every URL the page follows is relative to where it is served (`/lens`
//! redirects to `lens/`), so that it works behind a path prefix, as
//! `/docs` does. The page itself needs no key: it holds no data.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::config::{LensMode, Settings};
use crate::redact::Redactor;

const INDEX: &str = include_str!("../../lens/index.html");
const SCRIPT: &str = include_str!("../../lens/lens.js");
const REDACT: &str = include_str!("../../lens/redact.js");
const STYLE: &str = include_str!("../../lens/lens.css");

/// Where the page's configuration goes in `index.html`.
const CONFIG_MARK: &str = "\"__LENS_CONFIG__\"";

/// Nothing but the page's own files, and the API it reads.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The page, its configuration written in.
#[derive(Debug)]
pub struct Page {
    index: Bytes,
}

impl Page {
    /// `None` when the lens is off; an error when the operator's rules do
    /// not load (the start stops).
    pub fn load(settings: &Settings) -> Result<Option<Page>, String> {
        let mode = match settings.lens {
            LensMode::Off => return Ok(None),
            LensMode::Redacted => "redacted",
            LensMode::Full => "full",
        };
        let redactor = Redactor::load(settings.redact_patterns.as_deref())
            .map_err(|e| format!("cannot load the redaction rules: {e}"))?;
        Ok(Some(Page::with(mode, &redactor)))
    }

    fn with(mode: &str, redactor: &Redactor) -> Page {
        let config = serde_json::json!({"mode": mode, "rules": redactor.specs()});
        // It sits in a <script> element: no `</script>` may end it early.
        let config = config.to_string().replace('<', "\\u003c");
        Page {
            index: Bytes::from(INDEX.replacen(CONFIG_MARK, &config, 1)),
        }
    }
}

/// The page's routes, none when the lens is off.
pub fn router<S>(page: Option<Arc<Page>>) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    let Some(page) = page else {
        return Router::new();
    };
    let file = |body: &'static str, kind: &'static str| {
        get(move || async move { served(Bytes::from_static(body.as_bytes()), kind) })
    };
    Router::new()
        .route(
            "/lens",
            get(|| async { (StatusCode::SEE_OTHER, [(header::LOCATION, "lens/")]) }),
        )
        .route(
            "/lens/",
            get(move || async move { served(page.index.clone(), "text/html; charset=utf-8") }),
        )
        .route(
            "/lens/lens.js",
            file(SCRIPT, "text/javascript; charset=utf-8"),
        )
        .route(
            "/lens/redact.js",
            file(REDACT, "text/javascript; charset=utf-8"),
        )
        .route("/lens/lens.css", file(STYLE, "text/css; charset=utf-8"))
}

fn served(body: Bytes, kind: &'static str) -> Response {
    let mut res = body.into_response();
    let h = res.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, kind),
        (header::CONTENT_SECURITY_POLICY, POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
        (HeaderName::from_static("x-frame-options"), "DENY"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_is_written_into_the_page() {
        let rules = [("ours".to_owned(), "</script>x".to_owned())];
        let page = Page::with("redacted", &Redactor::new(&rules).unwrap());
        let html = std::str::from_utf8(&page.index).unwrap();
        assert!(!html.contains(CONFIG_MARK), "replaced");
        assert!(html.contains(r#"{"mode":"redacted","rules":[{"#), "{html}");
        assert!(html.contains(r#""name":"ours","pattern":"\u003c/script>x""#));
        assert_eq!(
            html.matches("</script>").count(),
            INDEX.matches("</script>").count()
        );
    }
}
