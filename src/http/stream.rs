//! Live events as server-sent events: `GET /svc/v1/events/stream`
//! (docs/api.md, "Events"). A stream starts at the newest event (or after
//! the one named by `Last-Event-ID` or `after`), takes the listing's
//! filters, and sends each event as it becomes visible (the backend says in
//! which order: `Backend::stream_events`), with a comment every
//! 15 s to keep proxies from closing it. Streams are bounded in number; each
//! ends when its client goes or the server begins to stop.

use bytes::Bytes;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::body::{EventStream, STREAMS_MAX, StreamSlot};
use super::error::ApiError;
use super::events::list_filter;
use super::paging::{query_pairs, query_value};
use super::{AppState, Reply};
use crate::backend::{Backend, EventFilter, StreamStart};
use crate::engine::EventId;

/// How often a stream looks for new events.
const POLL: Duration = Duration::from_millis(200);
/// How often an idle stream sends a comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Events read at a time.
const BATCH: usize = 256;

/// `GET /events/stream`: opens a stream and starts its task.
pub(super) async fn open(app: &AppState, query: &str, headers: &HeaderMap) -> Result<Reply, ApiError> {
    let pairs = query_pairs(query);
    let filter = EventFilter {
        types: list_filter(&pairs, "types"),
        queues: list_filter(&pairs, "queues"),
        job_types: list_filter(&pairs, "job_types"),
        subject: query_value(&pairs, "subject").map(str::to_string),
    };
    let resume = headers
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .or_else(|| query_value(&pairs, "after"))
        .filter(|id| !id.is_empty());
    let resume = match resume {
        Some(id) => Some(
            EventId::parse(id).ok_or_else(|| ApiError::invalid_request(Some("Last-Event-ID"), "not an event id"))?,
        ),
        None => None,
    };
    // From now: an id of this millisecond sorts before every later event.
    let now = EventId(crate::job::IdGenerator::default().next(crate::clock::Clock::now_ms(app.clock.as_ref()), 0));
    let named = query_value(&pairs, "unnamed") != Some("1");
    let slot = app.event_streams.take().ok_or_else(|| {
        ApiError::new("backend_error", format!("{STREAMS_MAX} event streams are open; retry shortly"))
            .detail("reason", "streams")
    })?;
    // Where it starts is settled before the client is answered, so that an
    // event published once it has its answer is sent. Should the backend
    // fail to say, the stream opens and ends at once: a browser's
    // `EventSource` tries again after `retry`, where an error status would
    // make it give up.
    let start = app.backend.stream_start(resume, now).outcome().await.ok();
    let (sender, receiver) = tokio::sync::mpsc::channel(4);
    let receiver = EventStream::new(receiver);
    let task = StreamTask {
        backend: app.backend.clone(),
        stopping: app.shutting_down.clone(),
        filter,
        start,
        named,
        sender,
        _slot: slot,
    };
    tokio::spawn(task.run());
    Ok(Reply::ok(String::new())
        .header(CONTENT_TYPE, "text/event-stream".to_string())
        .header(CACHE_CONTROL, "no-store".to_string())
        .streaming(receiver))
}

struct StreamTask {
    backend: Arc<dyn Backend>,
    stopping: Arc<AtomicBool>,
    filter: EventFilter,
    /// Where the stream starts, and whether events were missed before;
    /// `None` when the backend could not say.
    start: Option<StreamStart>,
    /// Whether each event names its type (`event:`); unnamed ones all
    /// reach a browser's `onmessage`.
    named: bool,
    sender: tokio::sync::mpsc::Sender<Bytes>,
    _slot: StreamSlot,
}

impl StreamTask {
    async fn run(self) {
        // Sent first, so that a client knows the stream is open.
        if self.sender.send(Bytes::from_static(b": open\n\nretry: 1000\n\n")).await.is_err() {
            return;
        }
        let Some(start) = self.start else {
            return;
        };
        if start.gap {
            let notice = "event: gap\ndata: {\"reason\":\"the events after Last-Event-ID are no longer held\"}\n\n";
            if self.sender.send(Bytes::from(notice)).await.is_err() {
                return;
            }
        }
        let mut position = start.position;
        let mut quiet = Duration::ZERO;
        while !self.stopping.load(Ordering::SeqCst) && !self.sender.is_closed() {
            let Ok(page) = self.backend.stream_events(position, BATCH, self.filter.clone()).outcome().await else {
                return;
            };
            // Past every event looked at, matching or not.
            position = page.position;
            let mut chunk = String::new();
            for event in &page.events {
                let id = event.id.to_string();
                chunk.push_str(&format!("id: {id}\n"));
                if self.named {
                    chunk.push_str(&format!("event: {}\n", event.kind.type_name()));
                }
                chunk.push_str("data: ");
                chunk.push_str(&crate::engine::render_event(event));
                chunk.push_str("\n\n");
            }
            if !chunk.is_empty() {
                quiet = Duration::ZERO;
                if self.sender.send(Bytes::from(chunk)).await.is_err() {
                    return;
                }
            }
            if page.has_more {
                continue;
            }
            tokio::time::sleep(POLL).await;
            quiet += POLL;
            if quiet >= KEEP_ALIVE {
                quiet = Duration::ZERO;
                if self.sender.send(Bytes::from_static(b": keep-alive\n\n")).await.is_err() {
                    return;
                }
            }
        }
    }
}
