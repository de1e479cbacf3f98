//! Validation at the edge: each field parses into its domain type or names
//! what is wrong with it, and a request becomes its validated struct only
//! when every field did (all the errors are reported at once).

use std::fmt::Display;

use super::error::{ApiError, FieldError};

/// A field's value, or what is wrong with it (and maybe with others).
pub type Valid<T> = Result<T, Vec<FieldError>>;

/// `r` as the value of `field`.
pub fn field<T, E: Display>(name: &str, r: Result<T, E>) -> Valid<T> {
    r.map_err(|e| invalid(name, e))
}

/// An optional field: absent is fine, present must parse.
pub fn optional<T, E: Display>(name: &str, r: Option<Result<T, E>>) -> Valid<Option<T>> {
    r.transpose().map_err(|e| invalid(name, e))
}

/// A `user_id` as given: `""` counts as absent, like `null` and no field,
/// wherever the body is looked at (validation, and the hash an idempotent
/// replay is compared by).
pub fn given_user_id(raw: Option<String>) -> Option<String> {
    raw.filter(|u| !u.is_empty())
}

/// A rule across fields: `holds`, or `field` is invalid with `message`.
pub fn rule(name: &str, holds: bool, message: impl Display) -> Valid<()> {
    if holds {
        Ok(())
    } else {
        Err(invalid(name, message))
    }
}

fn invalid(name: &str, message: impl Display) -> Vec<FieldError> {
    vec![FieldError {
        field: name.to_owned(),
        message: message.to_string(),
    }]
}

/// Every field valid, or every error.
pub trait AllValid: Sized {
    type Values;

    /// Every value, or every field's errors, in order.
    fn collect(self) -> Valid<Self::Values>;

    /// Every value, or a 422 naming every invalid field.
    fn all(self) -> Result<Self::Values, ApiError> {
        self.collect().map_err(ApiError::Validation)
    }
}

macro_rules! all_valid {
    ($($v:ident: $t:ident),+) => {
        impl<$($t),+> AllValid for ($(Valid<$t>,)+) {
            type Values = ($($t,)+);

            fn collect(self) -> Valid<Self::Values> {
                let ($($v,)+) = self;
                match ($($v,)+) {
                    ($(Ok($v),)+) => Ok(($($v,)+)),
                    ($($v,)+) => {
                        let mut errors = Vec::new();
                        $(errors.extend($v.err().unwrap_or_default());)+
                        Err(errors)
                    }
                }
            }
        }
    };
}

all_valid!(a: A);
all_valid!(a: A, b: B);
all_valid!(a: A, b: B, c: C);
all_valid!(a: A, b: B, c: C, d: D);
all_valid!(a: A, b: B, c: C, d: D, e: E);
all_valid!(a: A, b: B, c: C, d: D, e: E, f: F);
all_valid!(a: A, b: B, c: C, d: D, e: E, f: F, g: G);
all_valid!(a: A, b: B, c: C, d: D, e: E, f: F, g: G, h: H);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_valid_gives_every_value() {
        let got = (
            field("a", Ok::<_, &str>(1)),
            optional::<u8, &str>("b", None),
        )
            .all();
        assert!(matches!(got, Ok((1, None))));
    }

    #[test]
    fn all_valid_names_every_invalid_field_in_order() {
        let got = (
            field::<u8, _>("a", Err("bad a")),
            field("b", Ok::<_, &str>(2)),
            rule("c", false, "bad c"),
        )
            .all();
        let Err(ApiError::Validation(errors)) = got else {
            panic!("{got:?}")
        };
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["a", "c"]);
    }
}
