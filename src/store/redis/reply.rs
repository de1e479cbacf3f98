//! Reading the arrays the Lua scripts return, without panicking on
//! surprises. Each script's reply becomes a named struct where the script
//! is called; this is what they read it with.

use std::collections::VecDeque;

use redis::Value;

use crate::store::StoreError;

pub fn corrupt(what: impl Into<String>) -> StoreError {
    StoreError::Corrupt(what.into())
}

/// The elements of one script reply, taken in order.
pub struct Reply(VecDeque<Value>);

impl Reply {
    pub fn array(v: Value) -> Result<Self, StoreError> {
        match v {
            Value::Array(items) => Ok(Reply(items.into())),
            other => Err(corrupt(format!("expected an array, got {}", kind(&other)))),
        }
    }

    pub fn next(&mut self) -> Result<Value, StoreError> {
        self.0
            .pop_front()
            .ok_or_else(|| corrupt("script reply too short"))
    }

    pub fn opt_bytes_of(v: Value) -> Result<Option<Vec<u8>>, StoreError> {
        match v {
            Value::Nil => Ok(None),
            Value::BulkString(b) => Ok(Some(b)),
            Value::SimpleString(s) => Ok(Some(s.into_bytes())),
            Value::Okay => Ok(Some(b"OK".to_vec())),
            Value::Int(i) => Ok(Some(i.to_string().into_bytes())),
            other => Err(corrupt(format!("expected a string, got {}", kind(&other)))),
        }
    }

    pub fn bytes_of(v: Value) -> Result<Vec<u8>, StoreError> {
        Self::opt_bytes_of(v)?.ok_or_else(|| corrupt("expected a string, got nil"))
    }

    pub fn string_of(v: Value) -> Result<String, StoreError> {
        String::from_utf8(Self::bytes_of(v)?).map_err(|_| corrupt("a reply is not UTF-8"))
    }

    pub fn bytes(&mut self) -> Result<Vec<u8>, StoreError> {
        let v = self.next()?;
        Self::bytes_of(v)
    }

    pub fn string(&mut self) -> Result<String, StoreError> {
        let v = self.next()?;
        Self::string_of(v)
    }

    /// The session owner: `''` stands for none.
    pub fn owner(&mut self) -> Result<Option<String>, StoreError> {
        Ok(Some(self.string()?).filter(|s| !s.is_empty()))
    }

    pub fn int(&mut self) -> Result<i64, StoreError> {
        match self.next()? {
            Value::Int(i) => Ok(i),
            v => Self::string_of(v)?
                .parse()
                .map_err(|_| corrupt("expected an integer")),
        }
    }

    pub fn uint_of(v: Value) -> Result<u64, StoreError> {
        match v {
            Value::Int(i) => {
                u64::try_from(i).map_err(|_| corrupt("expected a non-negative integer"))
            }
            v => Self::string_of(v)?
                .parse()
                .map_err(|_| corrupt("expected a non-negative integer")),
        }
    }

    pub fn uint(&mut self) -> Result<u64, StoreError> {
        let v = self.next()?;
        Self::uint_of(v)
    }
}

/// What a value is, without its contents (they may be a user's text).
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Nil => "nil",
        Value::Int(_) => "an integer",
        Value::BulkString(_) | Value::SimpleString(_) | Value::Okay => "a string",
        Value::Array(_) => "an array",
        Value::ServerError(_) => "an error",
        _ => "another type",
    }
}
