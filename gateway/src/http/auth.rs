//! API keys on a request: the keys it presents (a bearer token or `x-api-key`), and their
//! comparison in constant time with the keys the gateway accepts.

use axum::http::{HeaderMap, header};
use std::collections::HashSet;

/// The keys a request presents: a bearer token (the scheme in any case, as RFC 9110
/// has it) and `x-api-key`, each tried, so a stray `Authorization` header (a proxy's
/// own) cannot hide a valid `x-api-key`.
pub(crate) fn presented_keys(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    let api_key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    bearer.into_iter().chain(api_key)
}

/// Whether `presented` is one of `keys`, compared in constant time against every key, so
/// the answer's timing tells nothing about how much of a key was right.
pub(crate) fn key_accepted(keys: &HashSet<String>, presented: &str) -> bool {
    use subtle::ConstantTimeEq;
    keys.iter().fold(false, |found, key| {
        found | bool::from(key.as_bytes().ct_eq(presented.as_bytes()))
    })
}
