//! The dashboard's pages: each reads through the backend and renders.

use maud::{Markup, html};

use super::super::error::ApiError;
use super::super::{AppState, Reply};
use super::layout::{
    button, clip, counts, frame, jobs_table, json_block, next_link, state_badge, throughput_chart, time,
};
use super::{Viewer, page as html_page};
use crate::engine::{JobCursor, JobFilter};
use crate::job::{JobId, JobState, WorkflowId, is_valid_queue};

/// Rows a page shows.
const ROWS: usize = 50;

type Query = [(String, String)];

fn value<'a>(query: &'a Query, name: &str) -> Option<&'a str> {
    query.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str()).filter(|value| !value.is_empty())
}

/// What an action reports back (`?done=`), shown once.
fn flash(query: &Query) -> Option<&str> {
    value(query, "done")
}

/// Routes `GET /ui/...` to its page.
pub(super) async fn page(app: &AppState, viewer: &Viewer, rest: &[&str], query: &Query) -> Result<Reply, ApiError> {
    let markup = match rest {
        [] => overview(app, viewer, query).await?,
        ["queues"] => queues(app, viewer, query).await?,
        ["queues", name] => queue(app, viewer, name, query).await?,
        ["jobs"] => jobs(app, viewer, query, "/jobs", "Jobs", None).await?,
        ["scheduled"] => jobs(app, viewer, query, "/scheduled", "Scheduled", Some(JobState::Scheduled)).await?,
        ["jobs", id] => job(app, viewer, id, query).await?,
        ["dead-letter"] => dead_letter(app, viewer, query).await?,
        ["cron"] => cron(app, viewer, query).await?,
        ["workers"] => workers(app, viewer, query).await?,
        ["workflows"] => workflows(app, viewer, query).await?,
        ["workflows", id] => workflow(app, viewer, id, query).await?,
        ["events"] => events(app, viewer, query).await?,
        _ => return Err(ApiError::not_found("page", rest.join("/"))),
    };
    Ok(html_page(markup))
}

async fn overview(app: &AppState, viewer: &Viewer, query: &Query) -> Result<Markup, ApiError> {
    let overview = app.backend.overview().outcome().await?;
    let minutes = app.backend.throughput_minutes(None).outcome().await?;
    let now = crate::clock::Clock::now_ms(app.clock.as_ref());
    let (queues, has_more) = app.backend.queues_page(None, ROWS).outcome().await?;
    let body = html! {
        section.figures {
            div { span.figure { (overview.queues) } " queues (" (overview.paused_queues) " paused)" }
            div { span.figure { (overview.workers) } " workers" }
            div { span.figure { (overview.dead_letter) } " in the dead letter listing" }
            div { span.figure { (overview.completed_last_minute) } " completed in the last minute" }
            div { span.figure { (overview.failed_last_minute) } " failed in the last minute" }
        }
        h2 { "Throughput" }
        (throughput_chart(&minutes, now))
        h2 { "Jobs by state" }
        (counts(|state| overview.count(state)))
        h2 { "Queues" }
        (queue_table(app, viewer, &queues, &app.ui_link("")))
        @if has_more { p { a href=(app.ui_link("/queues")) { "All queues →" } } }
    };
    Ok(frame(app, viewer, "", "Overview", flash(query), body))
}

fn queue_table(app: &AppState, viewer: &Viewer, queues: &[crate::engine::QueueSummary], next: &str) -> Markup {
    let now = crate::clock::Clock::now_ms(app.clock.as_ref());
    html! {
        table {
            thead { tr { th { "Queue" } th { "Waiting" } th { "Oldest waiting" } th { "Active" } th { "Completed" } th { "Discarded" } th { "Bound" } th { "State" } th {} } }
            tbody {
                @for queue in queues {
                    tr {
                        td { a href=(app.ui_link(&format!("/queues/{}", super::layout::encode(&queue.name)))) { (queue.name) } }
                        td { (queue.depth()) }
                        td { (age(queue.oldest_available_at.map(|at| now - at))) }
                        td { (queue.count(JobState::Active)) }
                        td { (queue.count(JobState::Completed)) }
                        td { (queue.count(JobState::Discarded)) }
                        td { @if let Some(bound) = &queue.backpressure { (bound.max_depth) } @else { "—" } }
                        td { @if queue.paused { span.badge.paused { "paused" } } @else { "running" } }
                        td { (pause_button(app, viewer, &queue.name, queue.paused, next)) }
                    }
                }
            }
        }
    }
}

/// A wait as people say it: "3 s", "4 min", "2 h", "5 d".
fn age(ms: Option<i64>) -> String {
    let Some(ms) = ms else { return "—".to_string() };
    let seconds = ms.max(0) / 1000;
    match seconds {
        0..60 => format!("{seconds} s"),
        60..3600 => format!("{} min", seconds / 60),
        3600..86400 => format!("{} h", seconds / 3600),
        _ => format!("{} d", seconds / 86400),
    }
}

fn pause_button(app: &AppState, viewer: &Viewer, name: &str, paused: bool, next: &str) -> Markup {
    let path = format!("/queues/{}/{}", super::layout::encode(name), if paused { "resume" } else { "pause" });
    button(app, viewer, &path, if paused { "Resume" } else { "Pause" }, next, &[])
}

async fn queues(app: &AppState, viewer: &Viewer, query: &Query) -> Result<Markup, ApiError> {
    let after = value(query, "cursor").map(str::to_string);
    let (queues, has_more) = app.backend.queues_page(after, ROWS).outcome().await?;
    let cursor = if has_more { queues.last().map(|queue| queue.name.clone()) } else { None };
    let body = html! {
        (queue_table(app, viewer, &queues, &app.ui_link("/queues")))
        (next_link(app, "/queues", query, cursor.as_deref()))
    };
    Ok(frame(app, viewer, "/queues", "Queues", flash(query), body))
}

async fn queue(app: &AppState, viewer: &Viewer, name: &str, query: &Query) -> Result<Markup, ApiError> {
    if !is_valid_queue(name) {
        return Err(ApiError::not_found("queue", name));
    }
    let stats =
        app.backend.queue_stats(name.to_string()).outcome().await?.ok_or_else(|| ApiError::not_found("queue", name))?;
    let summary = &stats.summary;
    let jobs = app.backend.jobs_page(JobFilter::all().queue(name), None, ROWS).outcome().await?;
    let minutes = app.backend.throughput_minutes(Some(name.to_string())).outcome().await?;
    let now = crate::clock::Clock::now_ms(app.clock.as_ref());
    let here = app.ui_link(&format!("/queues/{}", super::layout::encode(name)));
    let body = html! {
        p {
            @if summary.paused { span.badge.paused { "paused" } " " } @else { "Running. " }
            (summary.depth()) " waiting"
            @if let Some(at) = summary.oldest_available_at { " (the oldest for " (age(Some(now - at))) ")" }
            "; "
            (stats.completed_last_minute) " completed and " (stats.failed_last_minute) " failed in the last minute. "
            (pause_button(app, viewer, name, summary.paused, &here))
        }
        @if let Some(bound) = &summary.backpressure {
            p { "Backpressure: at most " (bound.max_depth) " waiting jobs"
                @if let Some(threshold) = bound.warning_threshold { ", warning from " (format!("{:.0}%", threshold * 100.0)) }
                "." }
        }
        (counts(|state| summary.count(state)))
        (throughput_chart(&minutes, now))
        @if viewer.may_act() {
            h2 { "Purge" }
            form.inline method="post" action=(app.ui_link("/jobs/bulk/purge")) {
                input type="hidden" name="csrf" value=(viewer.csrf);
                input type="hidden" name="next" value=(here);
                input type="hidden" name="queue" value=(name);
                label for="purge-state" { "Jobs in state " }
                select id="purge-state" name="state" {
                    @for state in JobState::ALL {
                        option value=(state.as_str()) { (state.as_str()) }
                    }
                }
                " "
                button type="submit" { "Delete all" }
            }
        }
        h2 { "Jobs" }
        (jobs_table(app, &jobs.jobs))
        @if jobs.next.is_some() { p { a href=(format!("{}?queue={}", app.ui_link("/jobs"), super::layout::encode(name))) { "More of this queue's jobs →" } } }
    };
    Ok(frame(app, viewer, "/queues", &format!("Queue {name}"), flash(query), body))
}

/// The listing's filter from the page's query, checked as the API checks it
/// (a page of one state fixes `state`).
fn job_filter(query: &Query, state: Option<JobState>) -> Result<JobFilter, ApiError> {
    let state = state.map(JobState::as_str);
    super::super::admin::jobs::parse_filter(
        |name| if name == "state" && state.is_some() { state } else { value(query, name) },
        "",
    )
}

async fn jobs(
    app: &AppState,
    viewer: &Viewer,
    query: &Query,
    path: &str,
    title: &str,
    state: Option<JobState>,
) -> Result<Markup, ApiError> {
    let filter = job_filter(query, state)?;
    let from = value(query, "cursor").and_then(JobCursor::parse);
    let found = app.backend.jobs_page(filter, from, ROWS).outcome().await?;
    let here = app.ui_link(path);
    let filters: Vec<(&str, &str)> = ["queue", "state", "type", "since", "until", "q"]
        .into_iter()
        .filter(|name| !(state.is_some() && *name == "state"))
        .filter_map(|name| value(query, name).map(|value| (name, value)))
        .collect();
    let cursor = found.next.map(|next| next.encode());
    let body = html! {
        form.filters method="get" action=(here) {
            label { "Queue " input name="queue" value=[value(query, "queue")]; }
            @if state.is_none() {
                label { "State "
                    select name="state" {
                        option value="" { "any" }
                        @for candidate in JobState::ALL {
                            option value=(candidate.as_str()) selected[value(query, "state") == Some(candidate.as_str())] { (candidate.as_str()) }
                        }
                    }
                }
            }
            label { "Type " input name="type" placeholder="email.*" value=[value(query, "type")]; }
            label { "Created from " input name="since" placeholder="2026-01-01T00:00:00Z" value=[value(query, "since")]; }
            label { "until " input name="until" value=[value(query, "until")]; }
            label { "Text " input type="search" name="q" placeholder="in args, meta, errors" value=[value(query, "q")]; }
            button type="submit" { "Search" }
        }
        p.note { "Looked at " (found.scanned) " jobs." }
        (jobs_table(app, &found.jobs))
        (next_link(app, path, query, cursor.as_deref()))
        @if viewer.may_act() {
            h2 { "Everything this filter finds" }
            @for (action, label) in [("retry", "Retry all"), ("cancel", "Cancel all"), ("delete", "Delete all")] {
                (button(app, viewer, &format!("/jobs/bulk/{action}"), label, &here, &filters.iter().copied().chain(state.map(|state| ("state", state.as_str()))).collect::<Vec<_>>()))
            }
        }
    };
    Ok(frame(app, viewer, path, title, flash(query), body))
}

async fn job(app: &AppState, viewer: &Viewer, id: &str, query: &Query) -> Result<Markup, ApiError> {
    let parsed = JobId::parse_any_case(id).ok_or_else(|| ApiError::not_found("job", id))?;
    let job = app.backend.job(parsed).outcome().await?.ok_or_else(|| ApiError::not_found("job", id))?;
    let here = app.ui_link(&format!("/jobs/{}", job.id));
    let run = job.run();
    let timeline = super::super::admin::jobs::timeline(&job);
    let body = html! {
        p { (state_badge(job.state)) " " (job.payload.job_type()) " in "
            a href=(app.ui_link(&format!("/queues/{}", super::layout::encode(&job.queue)))) { (job.queue.as_ref() as &str) }
            ", attempt " (job.attempt) " of " (job.retry.max_attempts) ", priority " (job.priority) "." }
        p.actions {
            @if !job.state.is_terminal() { (button(app, viewer, &format!("/jobs/{}/cancel", job.id), "Cancel", &here, &[])) }
            @if job.state == JobState::Discarded { (button(app, viewer, &format!("/jobs/{}/retry", job.id), "Retry", &here, &[])) }
            @if job.state.is_terminal() { (button(app, viewer, &format!("/jobs/{}/delete", job.id), "Delete", &app.ui_link("/jobs"), &[])) }
        }
        dl.fields {
            dt { "Created" } dd { (time(Some(job.created_at))) }
            dt { "Scheduled" } dd { (time(job.scheduled_at())) }
            dt { "Started" } dd { (time(run.started_at)) }
            dt { "Ended" } dd { (time(run.completed_at.or(run.cancelled_at).or(run.discarded_at))) }
            dt { "Worker" } dd { (run.worker_id.as_deref().unwrap_or("—")) }
            @if let Some(progress) = job.progress() {
                dt { "Progress" } dd { (format!("{:.0}%", progress.fraction * 100.0)) " " (progress.message.as_deref().unwrap_or("")) }
            }
        }
        h2 { "Timeline" }
        ol.timeline {
            @for entry in timeline.as_array().into_iter().flatten() {
                li {
                    code { (entry["at"].as_str().unwrap_or("")) } " " strong { (entry["event"].as_str().unwrap_or("")) }
                    @if let Some(message) = entry["message"].as_str() { ": " (message) }
                    @if let Some(worker) = entry["worker_id"].as_str() { " by " (worker) }
                }
            }
        }
        h2 { "Args" } (json_block(job.payload.args()))
        h2 { "Meta" } (json_block(job.payload.meta()))
        @if let Some(result) = &run.result { h2 { "Result" } (json_block(result)) }
        @if !run.errors.is_empty() {
            h2 { "Errors" }
            @for error in &run.errors {
                details open[std::ptr::eq(error, run.errors.last().expect("not empty"))] {
                    summary { "Attempt " (error.attempt) " · " (time(Some(error.occurred_at))) " · " code { (error.report.error_type) } ": " (error.report.message) }
                    @if !error.report.backtrace.is_empty() {
                        pre { code { @for frame in &error.report.backtrace { (frame) "\n" } } }
                    }
                }
            }
        }
    };
    Ok(frame(app, viewer, "/jobs", &format!("Job {}", job.id), flash(query), body))
}

async fn dead_letter(app: &AppState, viewer: &Viewer, query: &Query) -> Result<Markup, ApiError> {
    use crate::engine::DeadLetterCursor;
    let queue = value(query, "queue").filter(|queue| is_valid_queue(queue)).map(str::to_string);
    let after = value(query, "cursor").and_then(DeadLetterCursor::parse);
    let (jobs, next) = app.backend.dead_letter_page(after, ROWS, queue.clone()).outcome().await?;
    let total = app.backend.dead_letter_count(queue.clone()).outcome().await?;
    let here = app.ui_link("/dead-letter");
    let filter: Vec<(&str, &str)> =
        std::iter::once(("state", "discarded")).chain(queue.as_deref().map(|queue| ("queue", queue))).collect();
    let next = next.map(|next| next.to_string());
    let body = html! {
        p { (total) " discarded jobs" @if let Some(queue) = &queue { " in " (queue) } "." }
        form.filters method="get" action=(here) {
            label { "Queue " input name="queue" value=[queue.as_deref()]; }
            button type="submit" { "Filter" }
        }
        @if viewer.may_act() && total > 0 {
            p.actions {
                (button(app, viewer, "/jobs/bulk/retry", "Retry all", &here, &filter))
                (button(app, viewer, "/jobs/bulk/delete", "Delete all", &here, &filter))
            }
        }
        table {
            thead { tr { th { "Job" } th { "Type" } th { "Queue" } th { "Discarded" } th { "Error" } th {} } }
            tbody {
                @for job in &jobs {
                    tr {
                        td { a href=(app.ui_link(&format!("/jobs/{}", job.id))) { code { (job.id) } } }
                        td { (job.payload.job_type()) }
                        td { (job.queue.as_ref() as &str) }
                        td { (time(job.run().discarded_at)) }
                        td { @if let Some(error) = &job.run().error { code { (error.error_type) } ": " (clip(&error.message, 120)) } }
                        td {
                            (button(app, viewer, &format!("/jobs/{}/retry", job.id), "Retry", &here, &[]))
                            (button(app, viewer, &format!("/jobs/{}/delete", job.id), "Delete", &here, &[]))
                        }
                    }
                }
            }
        }
        (next_link(app, "/dead-letter", query, next.as_deref()))
    };
    Ok(frame(app, viewer, "/dead-letter", "Dead letter", flash(query), body))
}

async fn cron(app: &AppState, viewer: &Viewer, query: &Query) -> Result<Markup, ApiError> {
    let after = value(query, "cursor").map(str::to_string);
    let (entries, has_more) = app.backend.crons_page(after, ROWS, None).outcome().await?;
    let cursor = if has_more { entries.last().map(|entry| entry.definition.name.clone()) } else { None };
    let body = html! {
        @if entries.is_empty() { p.empty { "No cron entries." } } @else {
            table {
                thead { tr { th { "Name" } th { "Schedule" } th { "Time zone" } th { "Job type" } th { "Enabled" } th { "Last run" } th { "Next run" } th { "Runs" } } }
                tbody {
                    @for entry in &entries {
                        tr {
                            td { (entry.definition.name) }
                            td { code { (entry.definition.schedule) } }
                            td { (entry.definition.timezone) }
                            td { (entry.definition.job.payload.job_type()) }
                            td { (if entry.definition.enabled { "yes" } else { "no" }) }
                            td { (time(entry.last_run_at)) }
                            td { (time(entry.next_run_at)) }
                            td { (entry.run_count) }
                        }
                    }
                }
            }
        }
        (next_link(app, "/cron", query, cursor.as_deref()))
    };
    Ok(frame(app, viewer, "/cron", "Cron", flash(query), body))
}

async fn workers(app: &AppState, viewer: &Viewer, query: &Query) -> Result<Markup, ApiError> {
    let after = value(query, "cursor").map(str::to_string);
    let (entries, has_more) = app.backend.workers_page(after, ROWS, None).outcome().await?;
    let cursor = if has_more { entries.last().map(|entry| entry.worker_id.clone()) } else { None };
    let here = app.ui_link("/workers");
    let body = html! {
        @if entries.is_empty() { p.empty { "No workers have been seen." } } @else {
            table {
                thead { tr { th { "Worker" } th { "State" } th { "Queues" } th { "Jobs in hand" } th { "Last seen" } th { "Last heartbeat" } th {} } }
                tbody {
                    @for entry in &entries {
                        tr {
                            td { code { (entry.worker_id) } }
                            td { (entry.state.as_str()) }
                            td { (entry.queues.join(", ")) }
                            td { (entry.active_job_ids.len()) }
                            td { (time(Some(entry.last_seen_at))) }
                            td { (time(entry.last_heartbeat_at)) }
                            td {
                                @let id = super::layout::encode(&entry.worker_id);
                                @if entry.state.as_str() == "running" { (button(app, viewer, &format!("/workers/{id}/quiet"), "Quiet", &here, &[])) }
                                @if entry.state.as_str() != "terminate" { (button(app, viewer, &format!("/workers/{id}/terminate"), "Terminate", &here, &[])) }
                            }
                        }
                    }
                }
            }
        }
        (next_link(app, "/workers", query, cursor.as_deref()))
    };
    Ok(frame(app, viewer, "/workers", "Workers", flash(query), body))
}

async fn workflows(app: &AppState, viewer: &Viewer, query: &Query) -> Result<Markup, ApiError> {
    let after = value(query, "cursor").and_then(WorkflowId::parse);
    let (found, has_more) = app.backend.workflows_page(after, ROWS).outcome().await?;
    let cursor = if has_more { found.last().map(|workflow| workflow.id.to_string()) } else { None };
    let body = html! {
        @if found.is_empty() { p.empty { "No workflows." } } @else {
            table {
                thead { tr { th { "Workflow" } th { "Name" } th { "Kind" } th { "State" } th { "Steps" } th { "Created" } } }
                tbody {
                    @for workflow in &found {
                        tr {
                            td { a href=(app.ui_link(&format!("/workflows/{}", workflow.id))) { code { (workflow.id) } } }
                            td { (workflow.name.as_deref().unwrap_or("—")) }
                            td { (format!("{:?}", workflow.kind).to_lowercase()) }
                            td { (workflow.state.as_str()) }
                            td { (workflow.members.len()) }
                            td { (time(Some(workflow.created_at))) }
                        }
                    }
                }
            }
        }
        (next_link(app, "/workflows", query, cursor.as_deref()))
    };
    Ok(frame(app, viewer, "/workflows", "Workflows", flash(query), body))
}

async fn workflow(app: &AppState, viewer: &Viewer, id: &str, query: &Query) -> Result<Markup, ApiError> {
    let parsed = WorkflowId::parse_any_case(id).ok_or_else(|| ApiError::not_found("workflow", id))?;
    let found = app.backend.workflow(parsed).outcome().await?.ok_or_else(|| ApiError::not_found("workflow", id))?;
    let mut steps = Vec::with_capacity(found.members.len());
    for member in &found.members {
        let job = app.backend.job(member.job_id).outcome().await?;
        let state = job.as_ref().map(|job| job.state).or(member.outcome.as_ref().map(|outcome| outcome.state));
        steps.push((member, state));
    }
    let body = html! {
        p { (format!("{:?}", found.kind).to_lowercase()) ", " (found.state.as_str()) ", created " (time(Some(found.created_at))) "." }
        ol.steps {
            @for (member, state) in &steps {
                li {
                    a href=(app.ui_link(&format!("/jobs/{}", member.job_id))) { code { (member.job_id) } }
                    " " (member.job_type) " in " (member.queue) " "
                    @match state { Some(state) => (state_badge(*state)), None => span.badge { "gone" } }
                }
            }
        }
    };
    Ok(frame(app, viewer, "/workflows", &format!("Workflow {}", found.id), flash(query), body))
}

async fn events(app: &AppState, viewer: &Viewer, query: &Query) -> Result<Markup, ApiError> {
    let filters: Vec<String> = ["types", "queues"]
        .iter()
        .filter_map(|name| value(query, name).map(|given| format!("{name}={}", super::layout::encode(given))))
        .collect();
    // Unnamed events all reach the page's one `onmessage`.
    let stream =
        format!("{}?{}", app.ui_link("/events/stream"), [vec!["unnamed=1".to_string()], filters].concat().join("&"));
    let body = html! {
        p { "Events as they happen. Filter by type (" code { "job.*" } ") or queue." }
        form.filters method="get" action=(app.ui_link("/events")) {
            label { "Types " input name="types" value=[value(query, "types")] placeholder="job.*"; }
            label { "Queues " input name="queues" value=[value(query, "queues")]; }
            button type="submit" { "Filter" }
        }
        table id="live" data-stream=(stream) {
            thead { tr { th { "Time" } th { "Type" } th { "Subject" } } }
            tbody {}
        }
    };
    Ok(frame(app, viewer, "/events", "Events", flash(query), body))
}
