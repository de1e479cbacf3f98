//! Extractors whose every rejection is a problem+json (never axum's plain text),
//! naming the field at fault.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use bytes::Bytes;
use serde::de::DeserializeOwned;

use super::error::{ApiError, FieldError};

/// A JSON body. The content type is not enforced, so `curl -d` just works.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await?;
        let mut de = serde_json::Deserializer::from_slice(&bytes);
        let value = serde_path_to_error::deserialize(&mut de)
            .map_err(|e| invalid(e.path().to_string(), e.inner()))?;
        de.end()
            .map_err(|e| ApiError::field("body", format!("trailing characters: {e}")))?;
        Ok(JsonBody(value))
    }
}

/// Query parameters.
pub struct QueryParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(de)
            .map(QueryParams)
            .map_err(|e| invalid(e.path().to_string(), e.inner()))
    }
}

fn invalid(path: String, err: &impl std::fmt::Display) -> ApiError {
    let field = if path == "." || path.is_empty() {
        "body".to_owned()
    } else {
        path
    };
    ApiError::Validation(vec![FieldError {
        field,
        message: err.to_string(),
    }])
}

/// Path parameters of a route, rejected as problem+json.
macro_rules! path_extractor {
    ($name:ident) => {
        impl<S: Send + Sync> axum::extract::FromRequestParts<S> for $name {
            type Rejection = $crate::http::error::ApiError;

            async fn from_request_parts(
                parts: &mut axum::http::request::Parts,
                state: &S,
            ) -> Result<Self, Self::Rejection> {
                Ok(
                    axum::extract::Path::<$name>::from_request_parts(parts, state)
                        .await?
                        .0,
                )
            }
        }
    };
}
pub(crate) use path_extractor;
