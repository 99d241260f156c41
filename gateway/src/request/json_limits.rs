//! Bounding a request body's JSON before it is parsed (pure). A body of a few megabytes
//! can describe millions of values (`[[],[],...]`), and a parsed value costs tens of
//! bytes each, so the byte limit alone lets one request take hundreds of megabytes. One
//! pass over the bytes counts values and nesting without allocating; a body past either
//! limit is refused before `serde_json` builds anything.

use infera_proto::error_class::{ApiError, ErrorClass};

/// How much structure a request body may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonLimits {
    /// Values (scalars, arrays, objects and object keys' values), counted as the parser
    /// would allocate them.
    pub max_values: usize,
    /// Arrays and objects open at once.
    pub max_depth: usize,
}

/// What went past a limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonLimitError {
    /// More values than `max_values`.
    TooManyValues {
        /// The limit.
        limit: usize,
    },
    /// Nested deeper than `max_depth`.
    TooDeep {
        /// The limit.
        limit: usize,
    },
}

impl JsonLimitError {
    /// The client's error: 400, saying which limit and which flag sets it.
    pub(crate) fn to_api_error(&self) -> ApiError {
        let message = match self {
            Self::TooManyValues { limit } => format!(
                "request body has more than {limit} JSON values (message parts, token ids, \
                 list items); the gateway's limit is --max-request-values"
            ),
            Self::TooDeep { limit } => format!(
                "request body nests lists and objects more than {limit} deep; the \
                 gateway's limit is --max-request-depth"
            ),
        };
        ApiError::new(ErrorClass::BadRequest, message)
    }
}

/// Counts the values and nesting of `bytes` (JSON or not: syntax is the parser's job)
/// and fails at the first limit crossed. Every value but the first follows `[`, `,` or
/// `:` outside a string, so those bytes count them.
pub fn check_json_limits(bytes: &[u8], limits: JsonLimits) -> Result<(), JsonLimitError> {
    let mut values = 1usize;
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limits.max_depth {
                    return Err(JsonLimitError::TooDeep {
                        limit: limits.max_depth,
                    });
                }
                // An array's first element; an empty one costs its allocation too.
                values += usize::from(b == b'[');
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b',' | b':' => values += 1,
            _ => continue,
        }
        if values > limits.max_values {
            break;
        }
    }
    if values > limits.max_values {
        return Err(JsonLimitError::TooManyValues {
            limit: limits.max_values,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    const LIMITS: JsonLimits = JsonLimits {
        max_values: 10,
        max_depth: 3,
    };

    /// The parsed values of a document: what the count must never undercount.
    fn parsed_values(v: &Value) -> usize {
        1 + match v {
            Value::Array(a) => a.iter().map(parsed_values).sum(),
            Value::Object(o) => o.values().map(parsed_values).sum(),
            _ => 0,
        }
    }

    #[test]
    fn counts_and_depth_within_limits_pass() {
        for body in [
            r#"{"a":1,"b":[1,2,3]}"#,
            r#"[[["x"]]]"#,
            r#""[[[[[[,,,,,,,,,,,,,,,,""#,
            r#"{"s":"a \" [[[[ , : \\"}"#,
        ] {
            assert_eq!(check_json_limits(body.as_bytes(), LIMITS), Ok(()), "{body}");
        }
    }

    #[test]
    fn each_limit_is_named() {
        let cases = [
            ("[[[[1]]]]", JsonLimitError::TooDeep { limit: 3 }),
            (
                "[1,2,3,4,5,6,7,8,9,10]",
                JsonLimitError::TooManyValues { limit: 10 },
            ),
            (
                "[[],[],[],[],[],[]]",
                JsonLimitError::TooManyValues { limit: 10 },
            ),
            (
                r#"{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10}"#,
                JsonLimitError::TooManyValues { limit: 10 },
            ),
        ];
        for (body, want) in cases {
            assert_eq!(
                check_json_limits(body.as_bytes(), LIMITS),
                Err(want),
                "{body}"
            );
        }
        let err = JsonLimitError::TooManyValues { limit: 10 }.to_api_error();
        assert_eq!(err.class, ErrorClass::BadRequest);
        assert!(err.message.contains("--max-request-values"));
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[\\[\\]{},:\"\\\\a-z ]{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(5, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("[a-z,:\\[\"]{0,4}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// The count never falls below what the parser allocates, whatever the strings
        /// hold, so no body under the limit can parse into more values than it.
        #[test]
        fn never_undercounts(v in json_value()) {
            let text = serde_json::to_string(&v).unwrap();
            let exact = parsed_values(&v);
            let limits = JsonLimits { max_values: exact - 1, max_depth: usize::MAX };
            prop_assert!(check_json_limits(text.as_bytes(), limits).is_err(), "{text}");
            let limits = JsonLimits { max_values: 2 * exact + 1, max_depth: usize::MAX };
            prop_assert_eq!(check_json_limits(text.as_bytes(), limits), Ok(()), "{}", text);
        }
    }
}
