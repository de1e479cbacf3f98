//! Reading the arrays the Lua scripts return, without panicking on surprises.

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
            other => Err(corrupt(format!("expected an array, got {other:?}"))),
        }
    }

    pub fn next(&mut self) -> Result<Value, StoreError> {
        self.0
            .pop_front()
            .ok_or_else(|| corrupt("script reply too short"))
    }

    pub fn string_of(v: Value) -> Result<String, StoreError> {
        Self::opt_string_of(v)?.ok_or_else(|| corrupt("expected a string, got nil"))
    }

    pub fn opt_string_of(v: Value) -> Result<Option<String>, StoreError> {
        match v {
            Value::Nil => Ok(None),
            Value::BulkString(b) => String::from_utf8(b)
                .map(Some)
                .map_err(|_| corrupt("a reply is not UTF-8")),
            Value::SimpleString(s) => Ok(Some(s)),
            Value::Okay => Ok(Some("OK".into())),
            Value::Int(i) => Ok(Some(i.to_string())),
            other => Err(corrupt(format!("expected a string, got {other:?}"))),
        }
    }

    pub fn string(&mut self) -> Result<String, StoreError> {
        let v = self.next()?;
        Self::string_of(v)
    }

    pub fn opt_string(&mut self) -> Result<Option<String>, StoreError> {
        let v = self.next()?;
        Self::opt_string_of(v)
    }

    /// The session owner: `''` stands for none.
    pub fn owner(&mut self) -> Result<Option<String>, StoreError> {
        Ok(self.opt_string()?.filter(|s| !s.is_empty()))
    }

    pub fn int(&mut self) -> Result<i64, StoreError> {
        match self.next()? {
            Value::Int(i) => Ok(i),
            v => Self::string_of(v)?
                .parse()
                .map_err(|_| corrupt("expected an integer")),
        }
    }

    pub fn uint(&mut self) -> Result<u64, StoreError> {
        u64::try_from(self.int()?).map_err(|_| corrupt("expected a non-negative integer"))
    }

    pub fn list(&mut self) -> Result<Vec<Value>, StoreError> {
        match self.next()? {
            Value::Array(items) => Ok(items),
            other => Err(corrupt(format!("expected an array, got {other:?}"))),
        }
    }
}
