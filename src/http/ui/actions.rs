//! The dashboard's actions: each a form post by an admin that acts through
//! the backend, then sends the browser back to the page it came from with
//! what happened. Bulk actions first show how many jobs they would change
//! and ask to confirm.

use maud::html;

use super::super::error::ApiError;
use super::super::{AppState, Reply};
use super::layout::{encode, frame};
use super::{Viewer, field, next_page, redirect};
use crate::backend::run_bulk;
use crate::engine::{BulkAction, WorkerSignal};
use crate::job::{JobId, is_valid_queue};

type Form = [(String, String)];

/// Back to the page the form came from, saying what was done.
fn done(app: &AppState, form: &Form, message: &str) -> Reply {
    let next = next_page(app, form);
    let separator = if next.contains('?') { '&' } else { '?' };
    redirect(&format!("{next}{separator}done={}", encode(message)))
}

pub(super) async fn act(app: &AppState, viewer: &Viewer, rest: &[&str], form: &Form) -> Result<Reply, ApiError> {
    match rest {
        ["queues", name, action @ ("pause" | "resume")] => {
            if !is_valid_queue(name) {
                return Err(ApiError::invalid_request(Some("queue"), "not a valid queue name"));
            }
            let paused = *action == "pause";
            app.backend.pause_queue(name.to_string(), paused).outcome().await?;
            Ok(done(app, form, &format!("Queue {name} {}.", if paused { "paused" } else { "resumed" })))
        }
        ["jobs", "bulk", action] => {
            let action = BulkAction::parse(action).ok_or_else(|| ApiError::not_found("action", *action))?;
            bulk(app, viewer, action, form).await
        }
        ["jobs", id, action @ ("cancel" | "retry" | "delete")] => {
            let id = JobId::parse_any_case(id).ok_or_else(|| ApiError::not_found("job", *id))?;
            let action = BulkAction::parse(action).expect("matched above");
            let outcome = app.backend.bulk_jobs(action, vec![id]).outcome().await?;
            let verb = match action {
                BulkAction::Retry => "retried",
                BulkAction::Cancel => "cancelled",
                _ => "deleted",
            };
            let message = if outcome.changed == 1 {
                format!("Job {id} {verb}.")
            } else {
                format!("Job {id} was not {verb}: it had moved on.")
            };
            Ok(done(app, form, &message))
        }
        ["workers", id, signal @ ("quiet" | "terminate")] => {
            let signal = if *signal == "quiet" { WorkerSignal::Quiet } else { WorkerSignal::Terminate };
            app.backend.signal_worker(id.to_string(), signal).outcome().await?;
            let state = crate::engine::WorkerState::of(Some(signal));
            Ok(done(app, form, &format!("Worker {id} told to {}.", state.as_str())))
        }
        _ => Err(ApiError::not_found("action", rest.join("/"))),
    }
}

/// A bulk action by filter: without `confirm=yes`, a page that says how
/// many jobs it would change, with the button that does it.
async fn bulk(app: &AppState, viewer: &Viewer, action: BulkAction, form: &Form) -> Result<Reply, ApiError> {
    let filter =
        super::super::admin::jobs::parse_filter(|name| field(form, name).filter(|given| !given.is_empty()), "")?;
    let label = match action {
        BulkAction::Retry => "Retry",
        BulkAction::Cancel => "Cancel",
        _ => "Delete",
    };
    if field(form, "confirm") != Some("yes") {
        let report = run_bulk(app.backend.as_ref(), filter, action, true).await?;
        let kept: Vec<&(String, String)> = form.iter().filter(|(key, _)| key != "confirm" && key != "csrf").collect();
        let body = html! {
            p { "This " (action.as_str()) " would change " strong { (report.matched) } " jobs"
                @if let Some(queue) = field(form, "queue").filter(|queue| !queue.is_empty()) { " in queue " (queue) }
                @if let Some(state) = field(form, "state").filter(|state| !state.is_empty()) { " in state " (state) }
                "." }
            form method="post" action=(app.ui_link(&format!("/jobs/bulk/{}", action.as_str()))) {
                input type="hidden" name="csrf" value=(viewer.csrf);
                input type="hidden" name="confirm" value="yes";
                @for (key, value) in &kept {
                    input type="hidden" name=(key) value=(value);
                }
                button type="submit" { (label) " all " (report.matched) }
            }
            p { a href=(next_page(app, form)) { "Back" } }
        };
        return Ok(super::page(frame(app, viewer, "/jobs", &format!("{label} all?"), None, body)));
    }
    let report = run_bulk(app.backend.as_ref(), filter, action, false).await?;
    Ok(done(app, form, &format!("{label}: {} of {} jobs changed.", report.changed, report.matched)))
}
