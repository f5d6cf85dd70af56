//! Workflows as the engine holds them (docs/api.md, "Workflows"): members
//! with what they came to, a batch's callbacks (made when the workflow is
//! created, stored only when they fire), and the workflow's own state.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::super::events::WorkflowEvent;
use crate::clock::Millis;
use crate::job::{CallbackKind, FailureReport, Job, JobId, JobState, WorkflowId, WorkflowRole};
use crate::workflow::WorkflowKind;

/// `running` until it completes, fails or is cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum WorkflowState {
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl WorkflowState {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkflowState::Running => "running",
            WorkflowState::Completed => "completed",
            WorkflowState::Failed => "failed",
            WorkflowState::Cancelled => "cancelled",
        }
    }

    pub fn is_terminal(self) -> bool {
        self != WorkflowState::Running
    }
}

/// A chain step, or a group's or batch's job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Member {
    pub job_id: JobId,
    pub job_type: String,
    pub queue: String,
    /// How the member's job first ended: kept when the job itself is pruned
    /// (and not changed by a later dead-letter retry, which detaches it).
    pub outcome: Option<MemberOutcome>,
}

impl Member {
    /// The member a workflow's job is, not yet ended.
    pub fn of(job: &Job) -> Member {
        Member {
            job_id: job.id,
            job_type: job.payload.job_type().to_owned(),
            queue: job.queue.to_string(),
            outcome: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberOutcome {
    pub state: JobState,
    /// Compact JSON of the ack's result.
    pub result: Option<Arc<str>>,
}

/// A batch callback: the job it fires, made (id included) when the workflow
/// was created and stored only if it fires.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Callback {
    pub kind: CallbackKind,
    pub job: Arc<Job>,
    pub fired: bool,
    /// How the fired job first ended.
    pub outcome: Option<JobState>,
}

impl Callback {
    /// Whether the callback fires once every job ended, by its rule.
    pub fn fires(&self, any_failed: bool) -> bool {
        match self.kind {
            CallbackKind::OnComplete => true,
            CallbackKind::OnSuccess => !any_failed,
            CallbackKind::OnFailure => any_failed,
        }
    }

    /// The job the callback fires at `at`: made then, and available at once
    /// unless it is scheduled later.
    pub fn fired_job(&self, at: Millis) -> Job {
        let mut job = self.job.as_ref().clone();
        job.created_at = at;
        if job.scheduled_at().is_some_and(|scheduled| scheduled > at) {
            job.state = JobState::Scheduled;
        } else {
            job.state = JobState::Available;
            job.set_enqueued_at(Some(at));
        }
        job
    }
}

/// What failed the workflow: a member (by index) or a callback.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowFailure {
    /// The member's index; `None` for a callback.
    pub index: Option<u32>,
    pub job_id: JobId,
    pub error: Option<FailureReport>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workflow {
    pub id: WorkflowId,
    pub name: Option<String>,
    pub kind: WorkflowKind,
    pub state: WorkflowState,
    pub members: Vec<Member>,
    pub callbacks: Vec<Callback>,
    pub created_at: Millis,
    /// When it completed, failed or was cancelled.
    pub ended_at: Option<Millis>,
    pub failure: Option<WorkflowFailure>,
}

impl Workflow {
    /// A workflow just created, running.
    pub fn running(
        id: WorkflowId,
        name: Option<String>,
        kind: WorkflowKind,
        members: Vec<Member>,
        callbacks: Vec<Callback>,
        created_at: Millis,
    ) -> Workflow {
        Workflow {
            id,
            name,
            kind,
            state: WorkflowState::Running,
            members,
            callbacks,
            created_at,
            ended_at: None,
            failure: None,
        }
    }

    /// Ends a running workflow at `at`: completed, or failed by `failure`;
    /// answers the event that says so.
    pub fn finish(&mut self, at: Millis, failure: Option<WorkflowFailure>) -> WorkflowEvent {
        let workflow_type = self.kind.as_str();
        let event = match &failure {
            None => WorkflowEvent::Completed { workflow_type, duration_ms: at - self.created_at },
            Some(failure) => WorkflowEvent::Failed {
                workflow_type,
                failed_index: failure.index,
                failed_job_id: failure.job_id,
                error: failure.error.clone(),
            },
        };
        self.state = if failure.is_some() { WorkflowState::Failed } else { WorkflowState::Completed };
        self.ended_at = Some(at);
        self.failure = failure;
        event
    }

    /// About how many bytes of memory the workflow holds: itself, its
    /// members with their results, its callbacks' jobs.
    pub fn held_bytes(&self) -> u64 {
        let members: usize = self
            .members
            .iter()
            .map(|member| {
                std::mem::size_of::<Member>()
                    + member.job_type.len()
                    + member.queue.len()
                    + member
                        .outcome
                        .as_ref()
                        .and_then(|outcome| outcome.result.as_ref())
                        .map_or(0, |result| result.len())
            })
            .sum();
        let callbacks: u64 = self.callbacks.iter().map(|callback| callback.job.held_bytes()).sum();
        (std::mem::size_of::<Workflow>() + self.name.as_ref().map_or(0, String::len) + members) as u64 + callbacks
    }

    /// The first member that failed (by index), once it has ended.
    pub fn first_failed_member(&self) -> Option<(u32, JobId)> {
        let failed = |member: &&Member| member.outcome.as_ref().is_some_and(|outcome| is_failure(outcome.state));
        let (index, member) = self.members.iter().enumerate().find(|(_, member)| failed(member))?;
        Some((index as u32, member.job_id))
    }

    /// Members that completed, and members that failed (ended `discarded` or `cancelled`).
    pub fn member_counts(&self) -> (usize, usize) {
        let ended = |failed: bool| {
            self.members
                .iter()
                .filter_map(|member| member.outcome.as_ref())
                .filter(|outcome| is_failure(outcome.state) == failed)
                .count()
        };
        (ended(false), ended(true))
    }

    /// The results a job of this workflow is given (docs/api.md, "Results
    /// passing"): a chain step, those of the steps before it; a callback,
    /// every member's, with their final states; other members, none.
    pub fn parent_results(&self, role: WorkflowRole) -> ParentResults {
        let result = |member: &Member| member.outcome.as_ref().and_then(|outcome| outcome.result.clone());
        match (self.kind, role) {
            (WorkflowKind::Chain, WorkflowRole::Member(index)) => {
                ParentResults { results: self.members.iter().take(index as usize).map(result).collect(), states: None }
            }
            (_, WorkflowRole::Callback(_)) => ParentResults {
                results: self.members.iter().map(result).collect(),
                states: Some(
                    self.members.iter().map(|member| member.outcome.as_ref().map(|outcome| outcome.state)).collect(),
                ),
            },
            _ => ParentResults { results: Vec::new(), states: None },
        }
    }
}

/// What a workflow's job is given from the jobs before it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParentResults {
    /// Compact JSON of each result, `None` where there is none (yet).
    pub results: Vec<Option<Arc<str>>>,
    /// For a callback: each member's final state.
    pub states: Option<Vec<Option<JobState>>>,
}

/// A job that ended `discarded` or `cancelled` failed its workflow.
pub fn is_failure(state: JobState) -> bool {
    matches!(state, JobState::Discarded | JobState::Cancelled)
}
