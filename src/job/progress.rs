//! Job progress: how far a worker got with the attempt it holds, as it last
//! reported it (docs/api.md, "Progress"). The report's checks live here, so
//! HTTP and the embedding API refuse exactly the same reports.

use serde::{Deserialize, Serialize};

use super::json::{RawObject, kind_of, minify, string_value};
use super::{Job, JobExtra, ValidationError};
use crate::clock::Millis;
use crate::limits::{PROGRESS_DATA_BYTES_MAX, PROGRESS_MESSAGE_BYTES_MAX};

/// A progress report: a fraction from 0.0 to 1.0 (out of range clamped), an
/// optional message and optional JSON data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobProgress {
    /// From 0.0 to 1.0.
    pub fraction: f64,
    pub message: Option<String>,
    /// Compact JSON text.
    pub data: Option<String>,
    /// When it was reported; set by the engine.
    pub updated_at: Millis,
}

impl JobProgress {
    /// A report of `fraction` (clamped to 0.0-1.0; not a number is refused
    /// by [`JobProgress::check`]).
    pub fn new(fraction: f64) -> JobProgress {
        JobProgress { fraction: clamp(fraction), message: None, data: None, updated_at: 0 }
    }

    /// With a message of at most 4 KiB.
    pub fn message(mut self, message: impl Into<String>) -> JobProgress {
        self.message = Some(message.into());
        self
    }

    /// With data: any value that serializes to JSON of at most 64 KiB.
    pub fn data<T: Serialize>(mut self, data: &T) -> Result<JobProgress, ValidationError> {
        let text = serde_json::to_string(data).map_err(|error| {
            ValidationError::request(Some("data".to_string()), format!("data is not JSON: {error}"))
        })?;
        self.data = Some(text);
        Ok(self)
    }

    /// Refuses what HTTP refuses: a fraction that is not a number, a
    /// message or data past its bound, data that is not JSON.
    pub fn check(&self) -> Result<(), ValidationError> {
        if self.fraction.is_nan() {
            return Err(ValidationError::request(Some("progress".to_string()), "progress must be a number"));
        }
        if let Some(message) = &self.message
            && message.len() > PROGRESS_MESSAGE_BYTES_MAX
        {
            return Err(ValidationError::too_large("message", PROGRESS_MESSAGE_BYTES_MAX, message.len()));
        }
        if let Some(data) = &self.data {
            if data.len() > PROGRESS_DATA_BYTES_MAX {
                return Err(ValidationError::too_large("data", PROGRESS_DATA_BYTES_MAX, data.len()));
            }
            if serde_json::from_str::<&serde_json::value::RawValue>(data).is_err() {
                return Err(ValidationError::request(Some("data".to_string()), "data must be JSON"));
            }
        }
        Ok(())
    }

    /// Reads a `PUT /jobs/{id}/progress` body: `progress` (a number,
    /// required), `message` (a string or null), `data` (any JSON).
    pub fn from_object(object: &RawObject) -> Result<JobProgress, ValidationError> {
        let fraction = object
            .get_present("progress")
            .filter(|raw| kind_of(raw) == super::json::JsonKind::Number)
            .and_then(|raw| raw.get().parse::<f64>().ok())
            .filter(|number| number.is_finite())
            .ok_or_else(|| {
                ValidationError::request(Some("progress".to_string()), "progress is required: a number from 0.0 to 1.0")
            })?;
        let mut progress = JobProgress::new(fraction);
        if let Some(raw) = object.get_present("message").filter(|raw| raw.get() != "null") {
            let text = string_value(raw)
                .ok_or_else(|| ValidationError::request(Some("message".to_string()), "message must be a string"))?;
            progress.message = Some(text.into_owned());
        }
        if let Some(raw) = object.get_present("data") {
            progress.data = Some(minify(raw.get()));
        }
        progress.check()?;
        Ok(progress)
    }

    /// The bytes it holds beyond its place in the job.
    pub fn held_bytes(&self) -> usize {
        std::mem::size_of::<JobProgress>()
            + self.message.as_ref().map_or(0, String::len)
            + self.data.as_ref().map_or(0, String::len)
    }
}

fn clamp(fraction: f64) -> f64 {
    if fraction.is_nan() { fraction } else { fraction.clamp(0.0, 1.0) }
}

impl Job {
    /// The progress reported in the current attempt, if any.
    pub fn progress(&self) -> Option<&JobProgress> {
        self.extras.iter().find_map(|extra| match extra {
            JobExtra::Progress(progress) => Some(&**progress),
            _ => None,
        })
    }

    /// Replaces the job's progress (`None` clears it).
    pub fn set_progress(&mut self, progress: Option<JobProgress>) {
        if self.progress().is_some() {
            self.extras.retain(|extra| !matches!(extra, JobExtra::Progress(_)));
        }
        if let Some(progress) = progress {
            self.extras.push(JobExtra::Progress(Box::new(progress)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<JobProgress, ValidationError> {
        let object = super::super::json::parse_object(body.as_bytes()).expect("an object");
        JobProgress::from_object(&object)
    }

    #[test]
    fn a_fraction_out_of_range_is_clamped_and_a_missing_one_refused() {
        assert_eq!(parse(r#"{"progress":1.5}"#).unwrap().fraction, 1.0);
        assert_eq!(parse(r#"{"progress":-2}"#).unwrap().fraction, 0.0);
        assert_eq!(
            parse(r#"{"progress":0.25,"message":"a","data":{ "n" : 1 }}"#).unwrap().data.as_deref(),
            Some(r#"{"n":1}"#)
        );
        for body in [r#"{}"#, r#"{"progress":"0.5"}"#, r#"{"progress":null}"#, r#"{"progress":1e999}"#] {
            assert_eq!(parse(body).unwrap_err().field.as_deref(), Some("progress"), "{body}");
        }
        assert!(parse(r#"{"progress":0.5,"message":7}"#).is_err());
    }

    #[test]
    fn message_and_data_are_bounded() {
        let long = "m".repeat(PROGRESS_MESSAGE_BYTES_MAX + 1);
        assert!(parse(&format!(r#"{{"progress":0.5,"message":"{long}"}}"#)).is_err());
        let data = "d".repeat(PROGRESS_DATA_BYTES_MAX);
        assert!(parse(&format!(r#"{{"progress":0.5,"data":"{data}"}}"#)).is_err());
        assert!(JobProgress::new(f64::NAN).check().is_err());
        let mut bad = JobProgress::new(0.5);
        bad.data = Some("not json".into());
        assert!(bad.check().is_err());
    }
}
