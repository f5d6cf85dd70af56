//! What workers send besides failure reports: their ids, what they fetch,
//! and the results they complete jobs with. The HTTP routes and the
//! embedding API both check these here, so the two doors take the same
//! requests.

use serde_json::value::RawValue;

use super::enqueue::is_valid_queue;
use super::error::ValidationError;
use super::json::{BodyError, minify, parse_member_value};
use crate::limits::{
    FETCH_COUNT_MAX, FETCH_QUEUES_MAX, FETCH_WAIT_MS_MAX, JSON_DEPTH_MAX, RESULT_BYTES_MAX, WORKER_ID_CHARS_MAX,
};

/// `^[A-Za-z0-9._:@-]{1,256}$`, minus names that collide with worker routes.
pub fn is_valid_worker_id(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= WORKER_ID_CHARS_MAX
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:@-".contains(&b))
        && !matches!(text, "." | ".." | "fetch" | "ack" | "nack" | "heartbeat")
}

/// The error of a worker id that is not one (see [`is_valid_worker_id`]).
pub fn invalid_worker_id() -> ValidationError {
    ValidationError::request(
        Some("worker_id".to_string()),
        "worker_id must be 1 to 256 characters of A-Z, a-z, 0-9, '.', '_', ':', '@' and '-'",
    )
}

/// The queues a fetch names, in order: 1 to `FETCH_QUEUES_MAX` valid queue
/// names. `None` stands for an item that is not a string.
pub fn fetch_queues<S: AsRef<str>>(names: impl IntoIterator<Item = Option<S>>) -> Result<Vec<String>, ValidationError> {
    let error = || {
        ValidationError::request(
            Some("queues".to_string()),
            format!("queues is required: an array of 1 to {FETCH_QUEUES_MAX} queue names"),
        )
    };
    let mut queues = Vec::new();
    for name in names {
        let name = name.filter(|name| is_valid_queue(name.as_ref())).ok_or_else(error)?;
        if queues.len() == FETCH_QUEUES_MAX {
            return Err(error());
        }
        queues.push(name.as_ref().to_string());
    }
    if queues.is_empty() {
        return Err(error());
    }
    Ok(queues)
}

/// How many jobs a fetch claims at most: at least 1, and more than
/// `FETCH_COUNT_MAX` is `FETCH_COUNT_MAX`. `None` stands for a value that is
/// not an integer.
pub fn fetch_count(count: Option<i64>) -> Result<usize, ValidationError> {
    match count {
        Some(count) if count >= 1 => Ok(usize::try_from(count).unwrap_or(usize::MAX).min(FETCH_COUNT_MAX)),
        _ => Err(ValidationError::request(Some("count".to_string()), "count must be an integer of at least 1")),
    }
}

/// How long a fetch may wait for a job: 0 to `FETCH_WAIT_MS_MAX` ms. `None`
/// stands for a value that is not an integer.
pub fn fetch_wait_ms(wait_ms: Option<i64>) -> Result<u64, ValidationError> {
    match wait_ms {
        Some(wait) if (0..=FETCH_WAIT_MS_MAX as i64).contains(&wait) => Ok(wait as u64),
        _ => Err(ValidationError::request(
            Some("wait_ms".to_string()),
            format!("wait_ms must be an integer from 0 to {FETCH_WAIT_MS_MAX}"),
        )),
    }
}

/// The `result` of an ack as it is stored: compact JSON text of at most
/// `RESULT_BYTES_MAX` bytes.
pub fn ack_result(raw: &RawValue) -> Result<String, ValidationError> {
    let result = minify(raw.get());
    if result.len() > RESULT_BYTES_MAX {
        return Err(ValidationError::too_large("result", RESULT_BYTES_MAX, result.len()));
    }
    Ok(result)
}

/// An ack's `result` given as JSON text on its own: judged as it would be
/// inside an ack body (valid JSON, nesting no deeper than the body allows,
/// no larger than [`ack_result`] allows). `null` is no result.
pub fn parse_ack_result(text: &str) -> Result<Option<String>, ValidationError> {
    let raw = parse_member_value(text).map_err(|error| match error {
        BodyError::TooDeep => ValidationError::request(
            Some("result".to_string()),
            format!("result nests deeper than {} levels", JSON_DEPTH_MAX - 1),
        )
        .with_reason("too_deep"),
        BodyError::Malformed(detail) => {
            ValidationError::request(Some("result".to_string()), format!("result is not valid JSON: {detail}"))
                .with_reason("malformed_json")
        }
        // Any value may be a result.
        BodyError::NotAnObject => unreachable!("a member value is not required to be an object"),
    })?;
    if raw.get() == "null" {
        return Ok(None);
    }
    ack_result(raw).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_ids_that_name_routes_are_refused() {
        for valid in ["w-1", "host:1234@pool", "a.b_c", &"x".repeat(WORKER_ID_CHARS_MAX)] {
            assert!(is_valid_worker_id(valid), "{valid}");
        }
        for invalid in ["", ".", "..", "fetch", "ack", "nack", "heartbeat", "a/b", "a b", &"x".repeat(257)] {
            assert!(!is_valid_worker_id(invalid), "{invalid}");
        }
    }

    #[test]
    fn a_fetch_names_one_to_the_most_valid_queues() {
        assert_eq!(fetch_queues([Some("a"), Some("b")]).unwrap(), ["a", "b"]);
        assert!(fetch_queues(Vec::<Option<&str>>::new()).is_err());
        assert!(fetch_queues([Some("Bad Queue")]).is_err());
        assert!(fetch_queues([Some("a"), None]).is_err());
        let most = vec![Some("q"); FETCH_QUEUES_MAX];
        assert_eq!(fetch_queues(most.clone()).unwrap().len(), FETCH_QUEUES_MAX);
        assert!(fetch_queues(most.into_iter().chain([Some("q")])).is_err());
        assert_eq!((fetch_count(Some(1)), fetch_count(Some(1000))), (Ok(1), Ok(FETCH_COUNT_MAX)));
        assert!(fetch_count(Some(0)).is_err() && fetch_count(None).is_err());
        assert_eq!(fetch_wait_ms(Some(FETCH_WAIT_MS_MAX as i64)), Ok(FETCH_WAIT_MS_MAX));
        assert!(fetch_wait_ms(Some(-1)).is_err() && fetch_wait_ms(Some(FETCH_WAIT_MS_MAX as i64 + 1)).is_err());
    }

    #[test]
    fn a_result_given_as_text_is_judged_as_inside_an_ack_body() {
        assert_eq!(parse_ack_result(" { \"sent\" : true } ").unwrap().as_deref(), Some(r#"{"sent":true}"#));
        assert_eq!(parse_ack_result("null").unwrap(), None);
        let error = parse_ack_result("not json").unwrap_err();
        assert_eq!((error.field.as_deref(), error.reason), (Some("result"), Some("malformed_json")));
        assert!(parse_ack_result("").is_err() && parse_ack_result("1 2").is_err());
        // An ack body nests one level around its result.
        let deepest = format!("{}{}", "[".repeat(JSON_DEPTH_MAX - 1), "]".repeat(JSON_DEPTH_MAX - 1));
        assert!(parse_ack_result(&deepest).is_ok());
        let error = parse_ack_result(&format!("[{deepest}]")).unwrap_err();
        assert_eq!(error.reason, Some("too_deep"));
        let large = format!("\"{}\"", "x".repeat(RESULT_BYTES_MAX));
        assert_eq!(parse_ack_result(&large).unwrap_err().kind, super::super::ValidationKind::TooLarge);
    }
}
