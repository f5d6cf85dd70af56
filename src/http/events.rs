//! The event listing and its filters (docs/api.md, "Events").

use serde_json::Value;

use super::error::ApiError;
use super::paging::{page_limit, query_pairs, query_value};
use super::{AppState, Reply};
use crate::backend::EventFilter;
use crate::engine::render_event;
use crate::wire::ObjectWriter;

pub(super) fn list_filter(pairs: &[(String, String)], key: &str) -> Option<Vec<String>> {
    query_value(pairs, key).map(|text| text.split(',').filter(|item| !item.is_empty()).map(str::to_string).collect())
}

pub(super) async fn events(app: &AppState, query: &str) -> Result<Reply, ApiError> {
    let pairs = query_pairs(query);
    let limit = page_limit(&pairs)?;
    let filter = EventFilter {
        types: list_filter(&pairs, "types"),
        queues: list_filter(&pairs, "queues"),
        job_types: list_filter(&pairs, "job_types"),
        subject: query_value(&pairs, "subject").map(str::to_string),
    };
    let after = query_value(&pairs, "after").or_else(|| query_value(&pairs, "cursor")).filter(|id| !id.is_empty());
    let page = app.backend.events_page(after.map(str::to_string), limit, filter).outcome().await?;
    // A page that stopped looking early goes on from the last event it
    // looked at, matching or not.
    let cursor = page.next_after().map(|id| id.to_string()).or_else(|| after.map(str::to_string));
    let mut events = String::from("[");
    for (index, event) in page.events.iter().enumerate() {
        if index > 0 {
            events.push(',');
        }
        events.push_str(&render_event(event));
    }
    events.push(']');
    let mut body = ObjectWriter::default();
    body.raw("events", &events).value("cursor", &Value::from(cursor)).bool("has_more", page.has_more);
    if page.gap {
        body.bool("gap", true);
    }
    Ok(Reply::ok(body.finish()))
}
