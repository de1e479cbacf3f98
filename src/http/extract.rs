//! Extractors whose every rejection is a problem+json (never axum's plain text),
//! naming the field at fault.

use std::fmt;

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use bytes::Bytes;
use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};

use super::error::{ApiError, FieldError};

/// A JSON body. The content type is not enforced, so `curl -d` just works.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await?;
        // Every body is an object (serde would take an array for one).
        if bytes.trim_ascii_start().first() == Some(&b'[') {
            return Err(ApiError::field("body", "must be a JSON object"));
        }
        let mut de = serde_json::Deserializer::from_slice(&bytes);
        let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            if e.inner().is_syntax() || e.inner().is_eof() {
                ApiError::field("body", format!("is not valid JSON: {}", e.inner()))
            } else {
                invalid(e.path().to_string(), &e.inner().to_string())
            }
        })?;
        de.end()
            .map_err(|e| ApiError::field("body", format!("is not valid JSON: {e}")))?;
        Ok(JsonBody(value))
    }
}

/// A part of a body read as JSON first (`at` its field), deserialized as
/// the body would have been: errors name the field below `at`.
pub fn from_value_at<T: DeserializeOwned>(
    at: &str,
    value: serde_json::Value,
) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let below = e.path().to_string();
        let path = match below.as_str() {
            "." | "" | "?" => at.to_owned(),
            b if b.starts_with('[') => format!("{at}{b}"),
            b => format!("{at}.{b}"),
        };
        invalid(path, &e.inner().to_string())
    })
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
            .map_err(|e| invalid(e.path().to_string(), &e.inner().to_string()))
    }
}

/// For routes that take no query parameters: any is refused, as other
/// routes refuse the ones they do not know (one rule everywhere).
pub struct NoQuery;

impl<S: Send + Sync> FromRequestParts<S> for NoQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        match form_urlencoded::parse(query.as_bytes()).next() {
            None => Ok(NoQuery),
            Some((name, _)) => Err(ApiError::field(
                shown_name(&name),
                "unknown query parameter (this route takes none)",
            )),
        }
    }
}

/// A client's parameter or field name as an error names it: at most 64
/// characters (it is echoed back).
fn shown_name(name: &str) -> String {
    name.chars().take(64).collect()
}

/// A deserializer's complaint about `path`, in the API's terms: the field
/// it concerns and what is wrong with it, never a parser's type names.
fn invalid(path: String, err: &str) -> ApiError {
    let mut field = if path == "." || path.is_empty() || path == "?" {
        String::new()
    } else {
        path
    };
    let err = err.split(" at line ").next().unwrap_or(err);
    let message = if err.starts_with("unknown field `") {
        // The path names the field already.
        "unknown field".to_owned()
    } else if let Some(name) = quoted(err, "missing field `") {
        field = join(&field, name);
        "is required".to_owned()
    } else {
        explain(err)
    };
    if field.is_empty() {
        field = "body".to_owned();
    }
    ApiError::Validation(vec![FieldError { field, message }])
}

/// `err`'s first backquoted name after `prefix`, if it begins so.
fn quoted<'a>(err: &'a str, prefix: &str) -> Option<&'a str> {
    err.strip_prefix(prefix)?.split('`').next()
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

/// What serde says is wrong with a value, as what the value must be.
fn explain(err: &str) -> String {
    if let Some((_, expected)) = err.split_once(", expected ") {
        if err.starts_with("unknown variant") {
            let names = expected.trim_start_matches("one of ").replace('`', "");
            return format!("must be one of {names}");
        }
        return must_be(expected).to_owned();
    }
    match err {
        "invalid digit found in string" | "cannot parse integer from empty string" => {
            "must be a whole number, 0 or more".to_owned()
        }
        "number too large to fit in target type" => "is too large".to_owned(),
        e if e.starts_with("provided string was not") => "must be true or false".to_owned(),
        _ => "has the wrong type or value".to_owned(),
    }
}

/// serde's name of an expected type, as what a value must be.
fn must_be(expected: &str) -> &'static str {
    let e = expected.trim_start_matches("a ").trim_start_matches("an ");
    match e {
        "string" | "borrowed string" | "string or null" => "must be a string",
        "boolean" | "bool" => "must be true or false",
        "sequence" => "must be an array",
        "map" => "must be an object",
        _ if e.starts_with("struct ") => "must be an object",
        "u8" | "u16" | "u32" | "u64" | "usize" => "must be a whole number, 0 or more",
        "i8" | "i16" | "i32" | "i64" | "isize" => "must be a whole number",
        "f32" | "f64" => "must be a number",
        _ => "has the wrong type",
    }
}

/// A boolean as clients send it: JSON `true`/`false`; in a query string
/// also `True`/`False` (how Python's requests writes them) and `1`/`0`.
pub fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    Ok(Option::<Flag>::deserialize(d)?.map(|f| f.0))
}

struct Flag(bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FlagVisitor)
    }
}

struct FlagVisitor;

impl Visitor<'_> for FlagVisitor {
    type Value = Flag;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a boolean")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Flag, E> {
        Ok(Flag(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Flag, E> {
        match v {
            0 => Ok(Flag(false)),
            1 => Ok(Flag(true)),
            _ => Err(E::invalid_value(de::Unexpected::Unsigned(v), &self)),
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Flag, E> {
        match v {
            "true" | "True" | "TRUE" | "1" => Ok(Flag(true)),
            "false" | "False" | "FALSE" | "0" => Ok(Flag(false)),
            _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
        }
    }
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
