//! Listing and searching jobs (docs/api.md, "Admin: jobs"): which jobs a
//! listing keeps, where a page starts, and the page.
//!
//! The order is the job map's own: by shard (the low bits of the id), then
//! by id. It is stable, and a page starts where the last one stopped
//! whatever the listing's depth, at the cost of one shard's scan. A page
//! looks at no more than [`SCAN_BUDGET`] jobs (and at least one shard), and
//! reads no more than [`LOOKUP_BUDGET`] whole, so a search that matches
//! little comes back short, with a cursor saying where to continue.

use std::sync::Arc;

use crate::clock::Millis;
use crate::job::{Job, JobId, JobState};

/// Most jobs one page looks at beyond its first shard.
pub const SCAN_BUDGET: usize = 100_000;
/// Most jobs one page reads whole (those the filter's fields keep, to
/// check the text search and to answer); past it the page stops in its
/// shard, and the next goes on from there.
pub const LOOKUP_BUDGET: usize = 40_000;

/// Which jobs a listing keeps: each filter given must match.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct JobFilter {
    /// The job's queue, exactly.
    pub queue: Option<String>,
    /// Any of these states (none: any state).
    pub states: Vec<JobState>,
    /// The job type: exact, or `prefix.*`.
    pub job_type: Option<String>,
    /// Created at or after this time.
    pub created_from: Option<Millis>,
    /// Created before this time.
    pub created_before: Option<Millis>,
    /// Text found in the job's args, meta, or last error (its type, code or
    /// message), exactly as written (case counts).
    pub text: Option<String>,
}

impl JobFilter {
    /// Every job.
    pub fn all() -> JobFilter {
        JobFilter::default()
    }

    pub fn queue(mut self, queue: impl Into<String>) -> JobFilter {
        self.queue = Some(queue.into());
        self
    }

    pub fn state(mut self, state: JobState) -> JobFilter {
        self.states.push(state);
        self
    }

    pub fn job_type(mut self, pattern: impl Into<String>) -> JobFilter {
        self.job_type = Some(pattern.into());
        self
    }

    pub fn created_between(mut self, from: Option<Millis>, before: Option<Millis>) -> JobFilter {
        self.created_from = from;
        self.created_before = before;
        self
    }

    pub fn text(mut self, text: impl Into<String>) -> JobFilter {
        self.text = Some(text.into());
        self
    }

    /// The filters that read only the job's own fields (no text search).
    pub(crate) fn keeps_by_fields(&self, job: &Job) -> bool {
        self.queue.as_deref().is_none_or(|queue| *job.queue == *queue)
            && (self.states.is_empty() || self.states.contains(&job.state))
            && self.job_type.as_deref().is_none_or(|pattern| type_matches(pattern, job.payload.job_type()))
            && self.created_from.is_none_or(|from| job.created_at >= from)
            && self.created_before.is_none_or(|before| job.created_at < before)
    }

    /// Whether the text search, if any, finds its text in the job.
    pub(crate) fn keeps_by_text(&self, job: &Job) -> bool {
        let Some(text) = self.text.as_deref() else { return true };
        let payload = &job.payload;
        payload.args().contains(text)
            || payload.meta().contains(text)
            || job.run().error.as_ref().is_some_and(|error| {
                error.message.contains(text) || error.code.contains(text) || error.error_type.contains(text)
            })
    }

    /// Whether the listing keeps `job`.
    pub fn keeps(&self, job: &Job) -> bool {
        self.keeps_by_fields(job) && self.keeps_by_text(job)
    }
}

/// `pattern` is a type, or a prefix ending in `.*`.
fn type_matches(pattern: &str, job_type: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => job_type.starts_with(prefix),
        None => pattern == job_type,
    }
}

/// Where a page of a job listing starts: a shard, and in it the id after
/// which to go on (none: from its first job). A backend that lists in id
/// order alone (PostgreSQL) makes and reads only cursors with an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobCursor {
    pub(crate) shard: usize,
    pub(crate) after: Option<JobId>,
}

impl JobCursor {
    /// The cursor after `id`, in its shard.
    pub fn after_job(id: JobId) -> JobCursor {
        JobCursor { shard: super::super::job_table::shard_of(id), after: Some(id) }
    }

    /// The id after which the page goes on, if the cursor names one.
    pub fn after(&self) -> Option<JobId> {
        self.after
    }

    /// The cursor as text: `<shard>` or `<shard>.<id>`.
    pub fn encode(&self) -> String {
        match self.after {
            Some(id) => format!("{}.{id}", self.shard),
            None => self.shard.to_string(),
        }
    }

    /// Reads [`JobCursor::encode`]'s text; `None` for anything else.
    pub fn parse(text: &str) -> Option<JobCursor> {
        let (shard, after) = match text.split_once('.') {
            Some((shard, id)) => (shard, Some(JobId::parse(id)?)),
            None => (text, None),
        };
        let shard: usize = shard.parse().ok().filter(|shard| *shard < super::super::job_table::SHARDS)?;
        if after.is_some_and(|id| super::super::job_table::shard_of(id) != shard) {
            return None;
        }
        Some(JobCursor { shard, after })
    }
}

/// A page of a job listing.
#[derive(Debug, Clone)]
pub struct JobsPage {
    pub jobs: Vec<Arc<Job>>,
    /// Where the next page starts; `None` when the listing is done. A page
    /// cut short by the scan budget has one too.
    pub next: Option<JobCursor>,
    /// How many jobs the page looked at.
    pub scanned: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_and_refuses_what_it_did_not_write() {
        let id = JobId::parse("019a0000-0000-7000-8000-000000000041").unwrap();
        let shard = super::super::super::job_table::shard_of(id);
        let cursor = JobCursor { shard, after: Some(id) };
        assert_eq!(JobCursor::parse(&cursor.encode()), Some(cursor));
        assert_eq!(JobCursor::parse("5"), Some(JobCursor { shard: 5, after: None }));
        for bad in ["64", "x", "", "-1", &format!("{}.{id}", (shard + 1) % 64), "3.nope"] {
            assert_eq!(JobCursor::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn type_patterns_match_exactly_or_by_prefix() {
        assert!(type_matches("email.send", "email.send"));
        assert!(!type_matches("email.send", "email.sender"));
        assert!(type_matches("email.*", "email.send"));
        assert!(!type_matches("email.*", "sms.send"));
    }
}
