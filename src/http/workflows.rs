//! The workflow routes (docs/api.md, "Workflows"): create, read, cancel; the
//! workflow object; and the fields a workflow's job shows (`workflow_id`,
//! `parent_results`, `parent_states`).

use hyper::{Method, StatusCode};
use serde_json::{Value, json};

use super::auth::Role;
use super::error::ApiError;
use super::paging::percent_decode;
use super::{AppState, Reply};
use crate::engine::{ParentResults, Workflow, WorkflowState};
use crate::job::time::format_timestamp;
use crate::job::{Job, JobId, JobState, WorkflowId, WorkflowRole};
use crate::wire::report_value;
use crate::workflow::{WorkflowKind, parse_workflow_body};
use std::collections::HashMap;
use std::sync::Arc;

/// The workflow routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkflowRoute {
    Create,
    Get(String),
    Cancel(String),
}

impl WorkflowRoute {
    /// What a path under `/svc/v1/workflows` takes (`rest`: the segments after it).
    pub fn choices(rest: &[&str]) -> Vec<(Method, WorkflowRoute)> {
        match rest {
            [] => vec![(Method::POST, WorkflowRoute::Create)],
            [id] if !id.is_empty() => vec![
                (Method::GET, WorkflowRoute::Get(percent_decode(id))),
                (Method::DELETE, WorkflowRoute::Cancel(percent_decode(id))),
            ],
            _ => Vec::new(),
        }
    }

    /// The metrics number, method and template (as the router's templates).
    pub fn template(&self) -> (usize, &'static str, &'static str) {
        match self {
            WorkflowRoute::Create => (10, "POST", "/svc/v1/workflows"),
            WorkflowRoute::Get(_) => (11, "GET", "/svc/v1/workflows/{id}"),
            WorkflowRoute::Cancel(_) => (12, "DELETE", "/svc/v1/workflows/{id}"),
        }
    }

    /// Producers create and read workflows; cancelling one is the operator's.
    pub fn allows(&self, role: Role) -> bool {
        match self {
            WorkflowRoute::Create | WorkflowRoute::Get(_) => matches!(role, Role::Admin | Role::Producer),
            WorkflowRoute::Cancel(_) => role == Role::Admin,
        }
    }

    pub async fn handle(self, app: &AppState, body: &[u8]) -> Result<Reply, ApiError> {
        match self {
            WorkflowRoute::Create => create(app, body).await,
            WorkflowRoute::Get(id) => get(app, &id).await,
            WorkflowRoute::Cancel(id) => cancel(app, &id).await,
        }
    }

    #[cfg(test)]
    pub fn samples() -> Vec<WorkflowRoute> {
        vec![WorkflowRoute::Create, WorkflowRoute::Get("x".into()), WorkflowRoute::Cancel("x".into())]
    }
}

fn workflow_id(text: &str) -> Result<WorkflowId, ApiError> {
    WorkflowId::parse_any_case(text).ok_or_else(|| ApiError::not_found("workflow", text))
}

/// `POST /workflows`: 201 `{workflow}` with its `Location`.
async fn create(app: &AppState, body: &[u8]) -> Result<Reply, ApiError> {
    let definition = parse_workflow_body(body, &app.defaults)?;
    let id = app.backend.create_workflow(definition).outcome().await?;
    let body = json!({"workflow": read(app, id).await?}).to_string();
    Ok(Reply::ok(body)
        .with_status(StatusCode::CREATED)
        .header(hyper::header::LOCATION, format!("/svc/v1/workflows/{id}")))
}

/// `GET /workflows/{id}`.
async fn get(app: &AppState, id: &str) -> Result<Reply, ApiError> {
    let id = workflow_id(id)?;
    Ok(Reply::ok(json!({"workflow": read(app, id).await?}).to_string()))
}

/// `DELETE /workflows/{id}`: cancels it; 409 once it has ended.
async fn cancel(app: &AppState, id: &str) -> Result<Reply, ApiError> {
    let id = workflow_id(id)?;
    app.backend.cancel_workflow(id).outcome().await?;
    Ok(Reply::ok(json!({"workflow": read(app, id).await?}).to_string()))
}

/// The workflow object of `id`, with the states of the jobs it shows.
async fn read(app: &AppState, id: WorkflowId) -> Result<Value, ApiError> {
    let workflow =
        app.backend.workflow(id).outcome().await?.ok_or_else(|| ApiError::not_found("workflow", id.to_string()))?;
    // The states of members and fired callbacks the workflow has no end for.
    let open_members = workflow.members.iter().filter(|member| member.outcome.is_none()).map(|member| member.job_id);
    let open_callbacks = workflow
        .callbacks
        .iter()
        .filter(|callback| callback.fired && callback.outcome.is_none())
        .map(|callback| callback.job.id);
    let mut states = HashMap::new();
    for job_id in open_members.chain(open_callbacks) {
        if let Some(job) = app.backend.job(job_id).outcome().await? {
            states.insert(job_id, job.state);
        }
    }
    Ok(render(&workflow, &states))
}

/// The workflow object: counts, members with their jobs' states, a
/// batch's callbacks, and how it ended.
///
/// A member or fired callback whose job has ended shows the end the
/// workflow recorded, which its counts and outcome follow; its job may be
/// pruned since, or sent back by a dead-letter retry, without changing it
/// (docs/api.md, "`GET /workflows/{id}`").
fn render(workflow: &Workflow, states: &HashMap<JobId, JobState>) -> Value {
    let (completed, failed) = workflow.member_counts();
    let state_of = |job_id: JobId| states.get(&job_id).copied();
    let members: Vec<Value> = workflow
        .members
        .iter()
        .enumerate()
        .map(|(index, member)| {
            let state = member.outcome.as_ref().map(|outcome| outcome.state).or_else(|| state_of(member.job_id));
            json!({"index": index, "type": member.job_type, "queue": member.queue,
                   "job_id": member.job_id.to_string(), "state": state.map(|state| state.as_str())})
        })
        .collect();
    let total = workflow.members.len();
    let mut object = json!({
        "id": workflow.id.to_string(),
        "name": workflow.name,
        "type": workflow.kind.as_str(),
        "state": workflow.state.as_str(),
        "steps_total": total, "steps_completed": completed,
        "jobs_total": total, "jobs_completed": completed, "jobs_failed": failed,
        "created_at": format_timestamp(workflow.created_at),
    });
    let list = if workflow.kind == WorkflowKind::Chain { "steps" } else { "jobs" };
    object[list] = Value::Array(members);
    if workflow.kind == WorkflowKind::Batch {
        let mut callbacks = serde_json::Map::new();
        for callback in &workflow.callbacks {
            let mut entry = json!({"type": callback.job.payload.job_type(), "queue": callback.job.queue});
            if callback.fired {
                entry["job_id"] = callback.job.id.to_string().into();
                let state = callback.outcome.or_else(|| state_of(callback.job.id));
                entry["state"] = state.map(|state| state.as_str()).into();
            }
            callbacks.insert(callback.kind.as_str().to_string(), entry);
        }
        object["callbacks"] = Value::Object(callbacks);
    }
    if let Some(ended_at) = workflow.ended_at {
        let key = if workflow.state == WorkflowState::Cancelled { "cancelled_at" } else { "completed_at" };
        object[key] = format_timestamp(ended_at).into();
    }
    if let Some(failure) = &workflow.failure {
        object["failure"] = json!({
            "index": failure.index,
            "job_id": failure.job_id.to_string(),
            "error": failure.error.as_ref().map(|report| report_value(report, false)),
        });
    }
    object
}

/// What each workflow job of `jobs` shows besides itself: the workflow's
/// id, and the results (and for a callback, the final states) it is given.
/// Those are the workflow's: once it is pruned, its jobs show only its id
/// (docs/api.md, "`GET /workflows/{id}`"). Jobs of no workflow have no entry.
pub(super) async fn job_fields(
    app: &AppState,
    jobs: &[Arc<Job>],
) -> Result<HashMap<JobId, Vec<(&'static str, Value)>>, ApiError> {
    let mut fields = HashMap::new();
    for job in jobs {
        let Some((id, role)) = job.workflow() else { continue };
        let workflow = app.backend.workflow(id).outcome().await?;
        fields.insert(job.id, workflow_fields(id, role, workflow.as_deref()));
    }
    Ok(fields)
}

fn workflow_fields(id: WorkflowId, role: WorkflowRole, workflow: Option<&Workflow>) -> Vec<(&'static str, Value)> {
    let mut fields = vec![("workflow_id", Value::from(id.to_string()))];
    let Some(workflow) = workflow else { return fields };
    let ParentResults { results, states } = workflow.parent_results(role);
    let results = results
        .iter()
        .map(|result| result.as_deref().and_then(|text| serde_json::from_str(text).ok()).unwrap_or(Value::Null))
        .collect();
    fields.push(("parent_results", Value::Array(results)));
    if let Some(states) = states {
        let states = states.iter().map(|state| state.map(|state| state.as_str()).into()).collect();
        fields.push(("parent_states", Value::Array(states)));
    }
    fields
}
