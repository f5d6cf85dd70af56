//! The dashboard's frame (head, navigation, theme), the pieces pages share
//! (tables of jobs, counts, paging, action buttons), and its assets, which
//! are compiled into the binary.

use maud::{DOCTYPE, Markup, html};

use super::super::error::ApiError;
use super::super::{AppState, Reply};
use super::Viewer;
use crate::job::time::format_timestamp;
use crate::job::{Job, JobState};

const CSS: &str = include_str!("assets/ui.css");
const JS: &str = include_str!("assets/ui.js");

/// `GET /ui/assets/{name}`.
pub(super) fn asset(name: &str) -> Result<Reply, ApiError> {
    let (body, content_type) = match name {
        "ui.css" => (CSS, "text/css; charset=utf-8"),
        "ui.js" => (JS, "text/javascript; charset=utf-8"),
        _ => return Err(ApiError::not_found("asset", name)),
    };
    Ok(Reply::ok(body.to_string())
        .header(hyper::header::CONTENT_TYPE, content_type.into())
        .header(hyper::header::CACHE_CONTROL, "max-age=3600".into()))
}

const NAV: [(&str, &str); 10] = [
    ("", "Overview"),
    ("/queues", "Queues"),
    ("/jobs", "Jobs"),
    ("/scheduled", "Scheduled"),
    ("/dead-letter", "Dead letter"),
    ("/cron", "Cron"),
    ("/workers", "Workers"),
    ("/workflows", "Workflows"),
    ("/events", "Events"),
    ("/queues", ""),
];

/// Sections whose pages refresh themselves as events arrive.
const LIVE_SECTIONS: [&str; 4] = ["", "/queues", "/dead-letter", "/workers"];

/// A whole page: `title`, the section of the navigation it is in, its body.
pub(super) fn frame(
    app: &AppState,
    viewer: &Viewer,
    section: &str,
    title: &str,
    flash: Option<&str>,
    body: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" data-theme=[viewer.theme.as_deref()] {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · svc" }
                link rel="stylesheet" href=(app.ui_link("/assets/ui.css"));
                script src=(app.ui_link("/assets/ui.js")) defer {}
            }
            body {
                header.top {
                    a.brand href=(app.ui_link("")) { "svc" }
                    nav {
                        @for (path, label) in NAV.iter().filter(|(_, label)| !label.is_empty()) {
                            a href=(app.ui_link(path)) aria-current=[(*path == section).then_some("page")] { (label) }
                        }
                    }
                    div.tools {
                        (theme_form(app, viewer, &app.ui_link(section)))
                        @if viewer.signed_in {
                            span.role { (viewer.role.as_str()) }
                            form method="post" action=(app.ui_link("/sign-out")) {
                                input type="hidden" name="csrf" value=(viewer.csrf);
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main data-refresh=[LIVE_SECTIONS.contains(&section).then(|| app.ui_link("/events/stream?unnamed=1"))] {
                    h1 { (title) }
                    @if let Some(flash) = flash {
                        p.flash role="status" { (flash) }
                    }
                    (body)
                }
            }
        }
    }
}

fn theme_form(app: &AppState, viewer: &Viewer, next: &str) -> Markup {
    let dark = viewer.theme.as_deref() == Some("dark");
    html! {
        form method="post" action=(app.ui_link("/theme")) {
            input type="hidden" name="next" value=(next);
            input type="hidden" name="theme" value=(if dark { "light" } else { "dark" });
            button type="submit" { (if dark { "Light mode" } else { "Dark mode" }) }
        }
    }
}

/// The sign-in page (with keys configured).
pub(super) fn sign_in_page(app: &AppState, problem: Option<&str>, theme: Option<&str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" data-theme=[theme] {
            head {
                meta charset="utf-8";
                title { "Sign in · svc" }
                link rel="stylesheet" href=(app.ui_link("/assets/ui.css"));
            }
            body.sign-in {
                main {
                    h1 { "Sign in to svc" }
                    @if let Some(problem) = problem {
                        p.problem role="alert" { (problem) }
                    }
                    form method="post" action=(app.ui_link("/sign-in")) {
                        label for="key" { "API key (admin or viewer)" }
                        input id="key" type="password" name="key" autocomplete="current-password" required;
                        button type="submit" { "Sign in" }
                    }
                }
            }
        }
    }
}

/// An error as a page.
pub(super) fn error_page(app: &AppState, error: &ApiError) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { "Error · svc" } link rel="stylesheet" href=(app.ui_link("/assets/ui.css")); }
            body {
                main {
                    h1 { "Something went wrong" }
                    p.problem role="alert" { (error.message) " (" code { (error.code) } ")" }
                    p { a href=(app.ui_link("")) { "Back to the overview" } }
                }
            }
        }
    }
}

/// A form with one button that posts `action` (a path under the
/// dashboard), then comes back to `next`.
pub(super) fn button(
    app: &AppState,
    viewer: &Viewer,
    action: &str,
    label: &str,
    next: &str,
    hidden: &[(&str, &str)],
) -> Markup {
    html! {
        @if viewer.may_act() {
            form.inline method="post" action=(app.ui_link(action)) {
                input type="hidden" name="csrf" value=(viewer.csrf);
                input type="hidden" name="next" value=(next);
                @for (name, value) in hidden {
                    input type="hidden" name=(name) value=(value);
                }
                button type="submit" { (label) }
            }
        }
    }
}

pub(super) fn time(ms: Option<i64>) -> Markup {
    match ms {
        Some(ms) => html! { time datetime=(format_timestamp(ms)) { (format_timestamp(ms)) } },
        None => html! { "—" },
    }
}

pub(super) fn state_badge(state: JobState) -> Markup {
    html! { span class=(format!("badge {}", state.as_str())) { (state.as_str()) } }
}

/// Text cut to `max` characters, for table cells.
pub(super) fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// A table of jobs, each linking to its page.
pub(super) fn jobs_table(app: &AppState, jobs: &[std::sync::Arc<Job>]) -> Markup {
    html! {
        @if jobs.is_empty() {
            p.empty { "No jobs." }
        } @else {
            table {
                thead { tr { th { "Job" } th { "Type" } th { "Queue" } th { "State" } th { "Attempt" } th { "Created" } th { "Args" } } }
                tbody {
                    @for job in jobs {
                        tr {
                            td { a href=(app.ui_link(&format!("/jobs/{}", job.id))) { code { (job.id) } } }
                            td { (job.payload.job_type()) }
                            td { a href=(app.ui_link(&format!("/queues/{}", job.queue))) { (job.queue.as_ref() as &str) } }
                            td { (state_badge(job.state)) }
                            td { (job.attempt) }
                            td { (time(Some(job.created_at))) }
                            td.args { code { (clip(job.payload.args(), 80)) } }
                        }
                    }
                }
            }
        }
    }
}

/// A link to the next page, keeping the page's query but its cursor.
pub(super) fn next_link(app: &AppState, path: &str, query: &[(String, String)], cursor: Option<&str>) -> Markup {
    let Some(cursor) = cursor else { return html! {} };
    let mut pairs: Vec<String> = query
        .iter()
        .filter(|(key, _)| key != "cursor" && key != "done")
        .map(|(key, value)| format!("{}={}", encode(key), encode(value)))
        .collect();
    pairs.push(format!("cursor={}", encode(cursor)));
    html! { p.paging { a rel="next" href=(format!("{}?{}", app.ui_link(path), pairs.join("&"))) { "Next page →" } } }
}

/// Percent-encodes a query value.
pub(super) fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(byte as char),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// Counts per state, as a row of figures.
pub(super) fn counts(count: impl Fn(JobState) -> u64) -> Markup {
    html! {
        dl.counts {
            @for state in JobState::ALL {
                div { dt { (state_badge(state)) } dd { (count(state)) } }
            }
        }
    }
}

/// JSON text shown as text, pretty when it parses.
pub(super) fn json_block(text: &str) -> Markup {
    let pretty = serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|value| serde_json::to_string_pretty(&value).ok())
        .unwrap_or_else(|| text.to_string());
    html! { pre { code { (pretty) } } }
}

/// Jobs completed and failed over the last 24 hours as a bar chart drawn
/// on the server: one bar per 10 minutes, completed up, failed down.
pub(super) fn throughput_chart(minutes: &[crate::engine::MinuteCount], now: i64) -> Markup {
    const BUCKETS: usize = 144;
    const BUCKET_MS: i64 = 10 * 60_000;
    let (width, height) = (720.0, 120.0);
    let start = now - BUCKETS as i64 * BUCKET_MS;
    let mut buckets = [(0u64, 0u64); BUCKETS];
    for counts in minutes {
        let place = (counts.minute - start).div_euclid(BUCKET_MS);
        if (0..BUCKETS as i64).contains(&place) {
            buckets[place as usize].0 += counts.completed;
            buckets[place as usize].1 += counts.failed;
        }
    }
    let top = buckets.iter().map(|(completed, failed)| (*completed).max(*failed)).max().unwrap_or(0).max(1) as f64;
    let bar = width / BUCKETS as f64;
    let middle = height / 2.0;
    let scale = |count: u64| count as f64 / top * (middle - 2.0);
    let total: (u64, u64) = buckets.iter().fold((0, 0), |sum, bucket| (sum.0 + bucket.0, sum.1 + bucket.1));
    html! {
        figure.chart {
            svg viewBox=(format!("0 0 {width} {height}")) role="img"
                aria-label=(format!("Last 24 hours: {} completed, {} failed", total.0, total.1)) {
                line x1="0" x2=(width) y1=(middle) y2=(middle) class="axis" {}
                @for (index, (completed, failed)) in buckets.iter().enumerate() {
                    @if *completed > 0 {
                        rect.completed x=(format!("{:.1}", index as f64 * bar)) y=(format!("{:.1}", middle - scale(*completed)))
                            width=(format!("{:.1}", bar * 0.8)) height=(format!("{:.1}", scale(*completed))) {}
                    }
                    @if *failed > 0 {
                        rect.failed x=(format!("{:.1}", index as f64 * bar)) y=(middle)
                            width=(format!("{:.1}", bar * 0.8)) height=(format!("{:.1}", scale(*failed))) {}
                    }
                }
            }
            figcaption { "Last 24 hours, per 10 minutes: " (total.0) " completed (up), " (total.1) " failed (down)." }
        }
    }
}
