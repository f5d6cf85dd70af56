//! [`JobPayload`]: what a client gave a job to carry (type, `args`, `meta`,
//! tags, unknown fields), fixed once the job is accepted.
//!
//! Held as one shared allocation: a reference count, the two places where
//! `args` and `meta` begin, then the text, `type` then `args` then `meta`
//! back to back. A handle is one pointer, and cloning it counts a reference.
//! (Separate strings took three allocations and 120 bytes of fields; a
//! shared struct holding the text, 48 bytes and two allocations.) Tags and
//! unknown fields, which few jobs carry, are one more allocation when
//! present. Logs and snapshots encode it as the five fields it always had.

use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use triomphe::ThinArc;

/// The parts of a job that never change after it is accepted; shared by
/// reference between the engine, the read view and the log.
#[derive(Clone, PartialEq, Eq)]
pub struct JobPayload(ThinArc<Layout, u8>);

/// What comes before the text.
#[derive(PartialEq, Eq)]
struct Layout {
    /// Where `args` begins in the text.
    args_at: u32,
    /// Where `meta` begins in the text.
    meta_at: u32,
    rare: Option<Box<RareParts>>,
}

/// The parts of a payload few jobs carry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RareParts {
    tags: Vec<String>,
    extra: Vec<(String, String)>,
}

thread_local! {
    /// Where a decoded payload's text is put together before it is copied
    /// into its allocation.
    static SCRATCH: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Gives back a scratch buffer that a large payload grew, so that no thread
/// keeps one the size of the largest request it ever saw.
fn keep_scratch(text: &mut String) {
    const KEPT_BYTES: usize = 16 * 1024;
    if text.capacity() > KEPT_BYTES {
        *text = String::new();
    }
}

impl JobPayload {
    /// A payload from its parts: `args` and `meta` as compact JSON texts,
    /// `extra` the unknown top-level fields of the enqueue body as (name,
    /// compact JSON text). Texts are bounded by the request size limits, far
    /// below 4 GiB.
    pub fn new(job_type: &str, args: &str, meta: &str, tags: Vec<String>, extra: Vec<(String, String)>) -> JobPayload {
        let rare = (!tags.is_empty() || !extra.is_empty()).then(|| Box::new(RareParts { tags, extra }));
        SCRATCH.with(|scratch| {
            let mut text = scratch.borrow_mut();
            text.clear();
            text.push_str(job_type);
            text.push_str(args);
            text.push_str(meta);
            let payload = Self::from_text(&text, job_type.len(), job_type.len() + args.len(), rare);
            keep_scratch(&mut text);
            payload
        })
    }

    fn from_text(text: &str, args_at: usize, meta_at: usize, rare: Option<Box<RareParts>>) -> JobPayload {
        let offset = |at: usize| u32::try_from(at).expect("a job's texts are smaller than 4 GiB");
        let layout = Layout { args_at: offset(args_at), meta_at: offset(meta_at), rare };
        JobPayload(ThinArc::from_header_and_slice(layout, text.as_bytes()))
    }

    fn layout(&self) -> &Layout {
        &self.0.header.header
    }

    #[allow(unsafe_code)]
    fn text(&self) -> &str {
        // SAFETY: the bytes are copied from a `&str` (`from_text`), never changed.
        unsafe { std::str::from_utf8_unchecked(&self.0.slice) }
    }

    /// The same payload with another `meta` text.
    pub fn with_meta(&self, meta: &str) -> JobPayload {
        JobPayload::new(self.job_type(), self.args(), meta, self.tags().to_vec(), self.extra().to_vec())
    }

    pub fn job_type(&self) -> &str {
        &self.text()[..self.layout().args_at as usize]
    }

    /// Compact JSON text of the `args` array, as the client wrote it.
    pub fn args(&self) -> &str {
        &self.text()[self.layout().args_at as usize..self.layout().meta_at as usize]
    }

    /// Compact JSON text of the `meta` object.
    pub fn meta(&self) -> &str {
        &self.text()[self.layout().meta_at as usize..]
    }

    pub fn tags(&self) -> &[String] {
        self.layout().rare.as_ref().map_or(&[], |rare| &rare.tags)
    }

    /// Unknown top-level fields of the enqueue body: (name, compact JSON text).
    pub fn extra(&self) -> &[(String, String)] {
        self.layout().rare.as_ref().map_or(&[], |rare| &rare.extra)
    }

    /// About how many bytes the payload holds, its own fields included.
    pub fn held_bytes(&self) -> usize {
        let rare = self.layout().rare.as_ref().map_or(0, |rare| {
            std::mem::size_of::<RareParts>()
                + rare.tags.iter().map(|tag| tag.len() + std::mem::size_of::<String>()).sum::<usize>()
                + rare
                    .extra
                    .iter()
                    .map(|(key, value)| key.len() + value.len() + 2 * std::mem::size_of::<String>())
                    .sum::<usize>()
        });
        // The reference count, the layout and the text's length, then the text.
        std::mem::size_of::<usize>() * 2 + std::mem::size_of::<Layout>() + self.text().len() + rare
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

/// Decodes the stored form, putting the three texts together as they are
/// read instead of as three strings of their own.
impl<'de> Deserialize<'de> for JobPayload {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<JobPayload, D::Error> {
        const FIELDS: &[&str] = &["job_type", "args", "meta", "tags", "extra"];
        deserializer.deserialize_struct("StoredPayload", FIELDS, PayloadVisitor)
    }
}

struct PayloadVisitor;

impl<'de> Visitor<'de> for PayloadVisitor {
    type Value = JobPayload;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a job payload's five fields")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<JobPayload, A::Error> {
        let missing = |index| serde::de::Error::invalid_length(index, &"five fields");
        // Taken out of the thread's scratch (and put back) rather than
        // borrowed, so that nothing is borrowed while the decoder runs.
        let mut text = SCRATCH.with(|scratch| std::mem::take(&mut *scratch.borrow_mut()));
        text.clear();
        seq.next_element_seed(AppendTo(&mut text))?.ok_or_else(|| missing(0))?;
        let args_at = text.len();
        seq.next_element_seed(AppendTo(&mut text))?.ok_or_else(|| missing(1))?;
        let meta_at = text.len();
        seq.next_element_seed(AppendTo(&mut text))?.ok_or_else(|| missing(2))?;
        let tags: Vec<String> = seq.next_element()?.ok_or_else(|| missing(3))?;
        let extra: Vec<(String, String)> = seq.next_element()?.ok_or_else(|| missing(4))?;
        let rare = (!tags.is_empty() || !extra.is_empty()).then(|| Box::new(RareParts { tags, extra }));
        let payload = JobPayload::from_text(&text, args_at, meta_at, rare);
        keep_scratch(&mut text);
        SCRATCH.with(|scratch| *scratch.borrow_mut() = text);
        Ok(payload)
    }
}

/// Decodes a string onto the end of a text.
struct AppendTo<'a>(&'a mut String);

impl<'de> DeserializeSeed<'de> for AppendTo<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        // `deserialize_string`, as postcard reads `deserialize_str` only from a
        // slice it can borrow, and snapshots are decoded from a reader.
        deserializer.deserialize_string(self)
    }
}

impl<'de> Visitor<'de> for AppendTo<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<(), E> {
        self.0.push_str(text);
        Ok(())
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
        assert!(payload.layout().rare.is_none());
        assert_eq!(std::mem::size_of::<JobPayload>(), 8);
        assert_eq!(payload.with_meta(r#"{"a":1}"#).meta(), r#"{"a":1}"#);
    }
}
