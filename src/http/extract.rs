//! What handlers take out of a request (a job id from a path, a body that
//! must be an object), and the `Location` of a job.

use super::error::ApiError;
use crate::job::json::{RawObject, parse_object, push_ascii};
use crate::job::{Job, JobId, body_error};

/// A path or body id that is not a valid job id cannot exist: 404.
pub(super) fn job_id(text: &str) -> Result<JobId, ApiError> {
    JobId::parse_any_case(text).ok_or_else(|| ApiError::not_found("job", text))
}

/// Parses a body that must be a JSON object; its values stay raw text.
pub(super) fn object_body(body: &[u8]) -> Result<RawObject<'_>, ApiError> {
    parse_object(body).map_err(|error| ApiError::from(body_error(error)))
}

pub(super) fn location(job: &Job) -> String {
    let mut path = String::with_capacity(50);
    path.push_str("/svc/v1/jobs/");
    push_ascii(&mut path, &job.id.to_hyphenated());
    path
}
