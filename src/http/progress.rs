//! Job progress over HTTP (docs/api.md, "Progress"): `PUT` and `GET
//! /svc/v1/jobs/{id}/progress`, who may call them, and their answers.

use hyper::Method;

use super::auth::Role;
use super::error::ApiError;
use super::extract::{job_id, object_body};
use super::workers::worker_id;
use super::{AppState, Reply};
use crate::job::{Job, JobProgress};
use crate::wire::{ObjectWriter, push_progress_fields};

/// The progress routes of one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProgressRoute {
    Report(String),
    Get(String),
}

impl ProgressRoute {
    /// What `/svc/v1/jobs/{id}/progress` takes.
    pub fn choices(id: String) -> Vec<(Method, ProgressRoute)> {
        vec![(Method::PUT, ProgressRoute::Report(id.clone())), (Method::GET, ProgressRoute::Get(id))]
    }

    /// The metrics number, method and template (as the router's templates).
    pub fn template(&self) -> (usize, &'static str, &'static str) {
        match self {
            ProgressRoute::Report(_) => (50, "PUT", "/svc/v1/jobs/{id}/progress"),
            ProgressRoute::Get(_) => (51, "GET", "/svc/v1/jobs/{id}/progress"),
        }
    }

    /// A worker reports; anyone who may read a job reads its progress.
    pub fn allows(&self, role: Role) -> bool {
        match self {
            ProgressRoute::Report(_) => matches!(role, Role::Admin | Role::Worker),
            ProgressRoute::Get(_) => true,
        }
    }

    pub async fn handle(self, app: &AppState, body: &[u8]) -> Result<Reply, ApiError> {
        match self {
            ProgressRoute::Report(id) => report(app, &id, body).await,
            ProgressRoute::Get(id) => get(app, &id).await,
        }
    }

    #[cfg(test)]
    pub fn samples() -> Vec<ProgressRoute> {
        vec![ProgressRoute::Report("x".into()), ProgressRoute::Get("x".into())]
    }
}

/// `{progress, message, data}` in; 409 unless the job is active (and held
/// by `worker_id`, when given).
async fn report(app: &AppState, id: &str, body: &[u8]) -> Result<Reply, ApiError> {
    let id = job_id(id)?;
    let object = object_body(body)?;
    let progress = JobProgress::from_object(&object)?;
    let worker_id = worker_id(&object)?;
    let job = app.backend.report_progress(id, progress, worker_id).outcome().await.map_err(ApiError::from)?;
    Ok(Reply::ok(render(&job)))
}

async fn get(app: &AppState, id: &str) -> Result<Reply, ApiError> {
    let id = job_id(id)?;
    let job = app.backend.job(id).outcome().await?.ok_or_else(|| ApiError::not_found("job", id.to_string()))?;
    Ok(Reply::ok(render(&job)))
}

/// The job's id, state and attempt with its progress; `null`s when the
/// current attempt reported none.
fn render(job: &Job) -> String {
    let mut body = ObjectWriter::default();
    body.id("job_id", job.id).string("state", job.state.as_str()).number("attempt", job.attempt);
    match job.progress() {
        Some(progress) => push_progress_fields(&mut body, progress),
        None => {
            body.raw("progress", "null").raw("message", "null").raw("data", "null").raw("updated_at", "null");
        }
    }
    body.finish()
}
