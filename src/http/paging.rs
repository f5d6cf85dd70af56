//! Query strings and paging, the same for every list endpoint: `limit`
//! (default 25, at most 100) and an opaque `cursor` naming where the last
//! page ended.

use super::error::ApiError;
use crate::limits::{PAGE_SIZE_DEFAULT, PAGE_SIZE_MAX};

/// Query parameters, percent-decoded (`+` is a space).
pub(crate) fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let decode = |text: &str| percent_decode(&text.replace('+', " "));
            (decode(key), decode(value))
        })
        .collect()
}

pub(crate) fn query_value<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs.iter().find(|(name, _)| name == key).map(|(_, value)| value.as_str())
}

pub(crate) fn page_limit(pairs: &[(String, String)]) -> Result<usize, ApiError> {
    match query_value(pairs, "limit") {
        None => Ok(PAGE_SIZE_DEFAULT),
        Some(text) => match text.parse::<i64>() {
            Ok(limit) if limit >= 1 => Ok((limit as usize).min(PAGE_SIZE_MAX)),
            _ => Err(ApiError::invalid_request(
                Some("limit"),
                format!("limit must be an integer from 1 to {PAGE_SIZE_MAX}"),
            )),
        },
    }
}

pub(crate) fn encode_cursor(key: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key)
}

pub(crate) fn decode_cursor(cursor: &str) -> Result<String, ApiError> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        // Every cursor names a queue, job, worker, entry or URI, none of
        // which holds a control character.
        .filter(|text| !text.chars().any(char::is_control))
        .ok_or_else(|| ApiError::invalid_request(Some("cursor"), "cursor is not one this server issued"))
}

/// Decodes `%XX` escapes once; malformed escapes are kept as written.
pub fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%'
            && let Some(hex) = text.get(index + 1..index + 3)
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            out.push(byte);
            index += 3;
            continue;
        }
        out.push(bytes[index]);
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
