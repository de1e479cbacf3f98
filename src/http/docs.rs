//! `/openapi.json` and `/docs`, the Swagger UI page that renders it (its
//! files built into the binary by utoipa-swagger-ui).
//!
//! Every URL the page follows is relative to where it is served: `/docs`
//! redirects to `docs/`, and the page loads `../openapi.json`. Behind a
//! proxy that serves turnstore under a path prefix (`/turnstore/docs` to
//! `/docs`), the page then finds `/turnstore/openapi.json`; an absolute
//! `/docs/` or `/openapi.json` would leave the prefix out.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use utoipa_swagger_ui::Config;

use super::error::{ApiError, ProblemCode};

/// Where the page's script finds the document, from `/docs/`.
pub const DOCUMENT_FROM_PAGE: &str = "../openapi.json";

/// The routes of the document and of its page.
pub fn router<S>(document: &serde_json::Value) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    // Serialized once: the document is the same for every request.
    let json = Bytes::from(serde_json::to_vec(document).expect("a JSON value serializes"));
    let config = Arc::new(Config::new([DOCUMENT_FROM_PAGE]));
    let page = move |rest: Option<Path<String>>| {
        let config = config.clone();
        async move { page_file(rest.as_deref().map_or("", String::as_str), config) }
    };
    Router::new()
        .route(
            "/openapi.json",
            get(move || async move { ([(header::CONTENT_TYPE, "application/json")], json) }),
        )
        .route(
            "/docs",
            get(|| async { (StatusCode::SEE_OTHER, [(header::LOCATION, "docs/")]) }),
        )
        .route("/docs/", get(page.clone()))
        .route("/docs/{*rest}", get(page))
}

/// A file of the page (`""`: its `index.html`), as utoipa-swagger-ui
/// serves it: `swagger-initializer.js` holds `config`.
fn page_file(path: &str, config: Arc<Config<'static>>) -> Response {
    match utoipa_swagger_ui::serve(path, config) {
        Ok(Some(file)) => {
            let mut res = (
                [(header::CONTENT_TYPE, file.content_type)],
                file.bytes.into_owned(),
            )
                .into_response();
            if file.gzpipped {
                let gzip = HeaderValue::from_static("gzip");
                res.headers_mut().insert(header::CONTENT_ENCODING, gzip);
            }
            res
        }
        Ok(None) => ApiError::from(ProblemCode::NotFound).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "the docs page could not be served");
            ApiError::INTERNAL.into_response()
        }
    }
}
