//! [`JobPayload`]: what a client gave a job to carry (type, `args`, `meta`,
//! tags, unknown fields), fixed once the job is accepted.
//!
//! Held as one text, `type` then `args` then `meta` back to back, with the
//! two places where `args` and `meta` begin: one allocation where separate
//! strings took three, and 32 bytes of fields where they took 120. Tags and
//! unknown fields, which few jobs carry, are one more allocation when present.
//! Logs and snapshots encode it as the five fields it always had.

use serde::{Deserialize, Serialize};

/// The parts of a job that never change after it is accepted; shared by
/// reference between the engine and the read view.
#[derive(Clone, PartialEq, Eq)]
pub struct JobPayload {
    /// `type`, `args` and `meta`, back to back.
    text: Box<str>,
    /// Where `args` begins in `text`.
    args_at: u32,
    /// Where `meta` begins in `text`.
    meta_at: u32,
    rare: Option<Box<RareParts>>,
}

/// The parts of a payload few jobs carry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RareParts {
    tags: Vec<String>,
    extra: Vec<(String, String)>,
}

impl JobPayload {
    /// A payload from its parts: `args` and `meta` as compact JSON texts,
    /// `extra` the unknown top-level fields of the enqueue body as (name,
    /// compact JSON text). Texts are bounded by the request size limits, far
    /// below 4 GiB.
    pub fn new(job_type: &str, args: &str, meta: &str, tags: Vec<String>, extra: Vec<(String, String)>) -> JobPayload {
        let mut text = String::with_capacity(job_type.len() + args.len() + meta.len());
        text.push_str(job_type);
        text.push_str(args);
        text.push_str(meta);
        let offset = |at: usize| u32::try_from(at).expect("a job's texts are smaller than 4 GiB");
        let rare = (!tags.is_empty() || !extra.is_empty()).then(|| Box::new(RareParts { tags, extra }));
        JobPayload {
            text: text.into_boxed_str(),
            args_at: offset(job_type.len()),
            meta_at: offset(job_type.len() + args.len()),
            rare,
        }
    }

    /// The same payload with another `meta` text.
    pub fn with_meta(&self, meta: &str) -> JobPayload {
        JobPayload::new(self.job_type(), self.args(), meta, self.tags().to_vec(), self.extra().to_vec())
    }

    pub fn job_type(&self) -> &str {
        &self.text[..self.args_at as usize]
    }

    /// Compact JSON text of the `args` array, as the client wrote it.
    pub fn args(&self) -> &str {
        &self.text[self.args_at as usize..self.meta_at as usize]
    }

    /// Compact JSON text of the `meta` object.
    pub fn meta(&self) -> &str {
        &self.text[self.meta_at as usize..]
    }

    pub fn tags(&self) -> &[String] {
        self.rare.as_ref().map_or(&[], |rare| &rare.tags)
    }

    /// Unknown top-level fields of the enqueue body: (name, compact JSON text).
    pub fn extra(&self) -> &[(String, String)] {
        self.rare.as_ref().map_or(&[], |rare| &rare.extra)
    }

    /// About how many bytes the payload holds, its own fields included.
    pub fn held_bytes(&self) -> usize {
        let rare = self.rare.as_ref().map_or(0, |rare| {
            std::mem::size_of::<RareParts>()
                + rare.tags.iter().map(|tag| tag.len() + std::mem::size_of::<String>()).sum::<usize>()
                + rare
                    .extra
                    .iter()
                    .map(|(key, value)| key.len() + value.len() + 2 * std::mem::size_of::<String>())
                    .sum::<usize>()
        });
        std::mem::size_of::<JobPayload>() + self.text.len() + rare
    }
}

impl std::fmt::Debug for JobPayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobPayload")
            .field("job_type", &self.job_type())
            .field("args", &self.args())
            .field("meta", &self.meta())
            .field("tags", &self.tags())
            .field("extra", &self.extra())
            .finish()
    }
}

/// The stored form: the five fields in their first order.
#[derive(Serialize)]
struct StoredPayloadRef<'a> {
    job_type: &'a str,
    args: &'a str,
    meta: &'a str,
    tags: &'a [String],
    extra: &'a [(String, String)],
}

#[derive(Deserialize)]
struct StoredPayload {
    job_type: String,
    args: String,
    meta: String,
    tags: Vec<String>,
    extra: Vec<(String, String)>,
}

impl Serialize for JobPayload {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        StoredPayloadRef {
            job_type: self.job_type(),
            args: self.args(),
            meta: self.meta(),
            tags: self.tags(),
            extra: self.extra(),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for JobPayload {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<JobPayload, D::Error> {
        let stored = StoredPayload::deserialize(deserializer)?;
        Ok(JobPayload::new(&stored.job_type, &stored.args, &stored.meta, stored.tags, stored.extra))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct FivePartPayload {
        job_type: String,
        args: String,
        meta: String,
        tags: Vec<String>,
        extra: Vec<(String, String)>,
    }

    #[test]
    fn each_part_reads_back_and_the_encoding_is_the_five_fields() {
        let cases = [
            ("email.send", r#"["a@example.com"]"#, "{}", vec![], vec![]),
            (
                "t",
                "[]",
                r#"{"k":1}"#,
                vec!["a".to_string(), "b".to_string()],
                vec![("x_y".to_string(), "1".to_string())],
            ),
            ("", "", "", vec![], vec![]),
        ];
        for (job_type, args, meta, tags, extra) in cases {
            let payload = JobPayload::new(job_type, args, meta, tags.clone(), extra.clone());
            assert_eq!(
                (payload.job_type(), payload.args(), payload.meta(), payload.tags(), payload.extra()),
                (job_type, args, meta, tags.as_slice(), extra.as_slice())
            );
            let encoded = postcard::to_allocvec(&payload).unwrap();
            let flat = FivePartPayload {
                job_type: job_type.into(),
                args: args.into(),
                meta: meta.into(),
                tags: tags.clone(),
                extra: extra.clone(),
            };
            assert_eq!(encoded, postcard::to_allocvec(&flat).unwrap());
            assert_eq!(postcard::from_bytes::<JobPayload>(&encoded).unwrap(), payload);
        }
    }

    #[test]
    fn a_payload_without_tags_or_unknown_fields_is_one_allocation() {
        let payload = JobPayload::new("t", "[1]", "{}", Vec::new(), Vec::new());
        assert!(payload.rare.is_none());
        assert_eq!(std::mem::size_of::<JobPayload>(), 32);
        assert_eq!(payload.with_meta(r#"{"a":1}"#).meta(), r#"{"a":1}"#);
    }
}
