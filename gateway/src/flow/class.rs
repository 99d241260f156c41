//! Priority classes (pure): what a request's `x-infera-priority` header asks for, and
//! its TTFT deadline from `x-infera-ttft-deadline-ms` or the class's default.

use axum::http::HeaderMap;
use infera_proto::error_class::{ApiError, ErrorClass};
use std::time::Duration;

/// The header naming a request's class.
pub(crate) const PRIORITY_HEADER: &str = "x-infera-priority";

/// The header giving a request's own TTFT deadline, in milliseconds from its arrival.
pub(crate) const DEADLINE_HEADER: &str = "x-infera-ttft-deadline-ms";

/// A request's class: higher ones are sent first, lower ones shed first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Priority {
    /// Work that may wait or be refused first (offline jobs).
    Batch,
    /// The default.
    Standard,
    /// A person waiting on the answer.
    Interactive,
    /// Never shed for another class.
    Critical,
}

impl Priority {
    /// Every class, lowest first.
    pub(crate) const ALL: [Priority; 4] = [
        Priority::Batch,
        Priority::Standard,
        Priority::Interactive,
        Priority::Critical,
    ];

    /// Its name in the header and the metrics.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Batch => "batch",
            Self::Standard => "standard",
            Self::Interactive => "interactive",
            Self::Critical => "critical",
        }
    }

    /// The class a name gives (case-insensitive).
    pub(crate) fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(name.trim()))
    }

    /// Its index in [`Priority::ALL`].
    #[cfg(test)]
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// What a request's headers ask of flow control.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Asked {
    /// Its class.
    pub class: Priority,
    /// Its own TTFT deadline, when it states one.
    pub deadline: Option<Duration>,
}

/// The class and deadline `headers` ask for (`default` without the class header); a
/// value that is not one gets 400 naming the header.
pub(crate) fn asked(headers: &HeaderMap, default: Priority) -> Result<Asked, ApiError> {
    let value = |name: &str| {
        headers
            .get(name)
            .map(|v| v.to_str().map(str::trim).unwrap_or("\u{fffd}"))
    };
    let class = match value(PRIORITY_HEADER) {
        None => default,
        Some(v) => Priority::parse(v).ok_or_else(|| {
            ApiError::new(
                ErrorClass::BadRequest,
                format!(
                    "header {PRIORITY_HEADER}: '{v}' is not a class; use critical, interactive, standard or batch"
                ),
            )
            .with_param(PRIORITY_HEADER)
        })?,
    };
    let deadline = match value(DEADLINE_HEADER) {
        None => None,
        Some(v) => Some(
            v.parse::<u64>()
                .ok()
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis)
                .ok_or_else(|| {
                    ApiError::new(
                        ErrorClass::BadRequest,
                        format!(
                            "header {DEADLINE_HEADER}: '{v}' is not a positive number of milliseconds"
                        ),
                    )
                    .with_param(DEADLINE_HEADER)
                })?,
        ),
    };
    Ok(Asked { class, deadline })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn classes_order_and_parse() {
        assert!(Priority::Critical > Priority::Interactive);
        assert!(Priority::Standard > Priority::Batch);
        for p in Priority::ALL {
            assert_eq!(Priority::parse(&p.as_str().to_uppercase()), Some(p));
            assert_eq!(Priority::ALL[p.index()], p);
        }
        assert_eq!(Priority::parse("urgent"), None);
    }

    #[test]
    fn headers_give_the_class_and_deadline_and_bad_values_name_the_header() {
        let got = asked(&headers(&[]), Priority::Standard).unwrap();
        assert_eq!((got.class, got.deadline), (Priority::Standard, None));
        let got = asked(
            &headers(&[(PRIORITY_HEADER, "Batch"), (DEADLINE_HEADER, "250")]),
            Priority::Standard,
        )
        .unwrap();
        assert_eq!(
            (got.class, got.deadline),
            (Priority::Batch, Some(Duration::from_millis(250)))
        );
        for (k, v) in [
            (PRIORITY_HEADER, "urgent"),
            (DEADLINE_HEADER, "0"),
            (DEADLINE_HEADER, "soon"),
        ] {
            let e = asked(&headers(&[(k, v)]), Priority::Standard).unwrap_err();
            assert_eq!(e.class, ErrorClass::BadRequest);
            assert_eq!(e.param.as_deref(), Some(k), "{}", e.message);
        }
    }
}
