//! The live event stream on PostgreSQL (docs/postgres.md, "Events"): events
//! in the order of the transactions that wrote them.
//!
//! An event's id is made before its transaction commits, so a transaction
//! that commits late adds events with ids below ones already visible; a
//! stream that went by id would step past them. A stream reads instead as
//! webhook matching does (`webhooks.rs`): by `(xid, id)`, and only rows of
//! transactions older than every transaction still running (the snapshot's
//! `xmin`). A transaction that gets its id later than a read cannot write
//! below that read's horizon, so nothing is stepped past; the price is that
//! a long transaction anywhere in the cluster holds the stream back until
//! it ends.

use super::events::{SCAN_CHUNK, SCAN_MAX, decode, last_of_run};
use super::sql::Prepared;
use crate::backend::{EventFilter, StreamPage, StreamPosition, StreamStart};
use crate::engine::{EngineError, EventId, Unavailable};
use crate::job::JobId;
use deadpool_postgres::GenericClient;

/// The first event id there is: a position before every row of a
/// transaction.
const FIRST: EventId = EventId(JobId(0));

fn failed(error: tokio_postgres::Error) -> EngineError {
    tracing::warn!(%error, "reading events failed");
    EngineError::Unavailable { reason: Unavailable::Database }
}

fn xid(text: &str) -> Result<u64, EngineError> {
    text.parse().map_err(|_| {
        tracing::warn!(xid = text, "the database answered an unreadable transaction id");
        EngineError::Unavailable { reason: Unavailable::Database }
    })
}

fn event_id(text: &str) -> Result<EventId, EngineError> {
    JobId::parse(text).map(EventId).ok_or_else(|| {
        tracing::warn!(id = text, "the database holds an unreadable event id");
        EngineError::Unavailable { reason: Unavailable::Database }
    })
}

/// Where a stream starts.
///
/// - After `resume`, when its row is held in transaction `X`: from the
///   oldest of `X`, the transactions still running and those that wrote
///   events after `resume`, passing over the events up to `resume` of
///   transactions up to `X`. A stream that sent `resume` had sent every
///   event of the transactions before `X`, so a few may come again; a
///   client that listed up to `resume` (`GET /events`) misses none after it.
/// - After an id not held, with events after it (pruned, or never held
///   here): `gap`, and from the oldest transaction among those events or
///   still running, so none of them is skipped (some may come again).
/// - Otherwise, and without `resume`: from now, the transactions this
///   snapshot does not see committed; after an id not held, `gap` when no
///   event is held at all (as on the local engine).
pub async fn start(client: &impl GenericClient, resume: Option<EventId>) -> Result<StreamStart, EngineError> {
    let mut gap = false;
    if let Some(resume) = resume {
        let id = resume.0.to_string();
        // Aliased: ORDER BY `id` must name the uuid, not the text.
        let held = client
            .rows(
                "SELECT xid::text AS xid_text, id::text AS id_text, members FROM svc_events \
                 WHERE id <= $1::text::uuid ORDER BY id DESC LIMIT 1",
                &[&id],
            )
            .await
            .map_err(failed)?;
        let held = match held.first() {
            Some(row) => {
                let (first, members): (EventId, i32) = (event_id(row.get(1))?, row.get(2));
                let covers = last_of_run(first.0, members).is_some_and(|last| last >= resume.0);
                if covers { Some(xid(row.get(0))?) } else { None }
            }
            None => None,
        };
        // The oldest of the transactions that wrote events after `resume`
        // and those still running (`least` passes over nulls; xid8 has no
        // `min` before PostgreSQL 15).
        let oldest = client
            .row(
                "SELECT least($2::text::xid8, (SELECT xid FROM svc_events WHERE id > $1::text::uuid \
                   ORDER BY xid LIMIT 1), pg_snapshot_xmin(pg_current_snapshot()))::text, \
                 EXISTS (SELECT 1 FROM svc_events WHERE id > $1::text::uuid), EXISTS (SELECT 1 FROM svc_events)",
                &[&id, &held.map(|xid| xid.to_string())],
            )
            .await
            .map_err(failed)?;
        let (from, later, any): (String, bool, bool) = (oldest.get(0), oldest.get(1), oldest.get(2));
        if held.is_some() || later {
            let position = StreamPosition::Committed {
                xid: xid(&from)?,
                row: FIRST,
                through: None,
                opened: None,
                resumed: held.map(|held| (held, resume)),
            };
            return Ok(StreamStart { position, gap: held.is_none() });
        }
        gap = !any;
    }
    let now = client
        .row("SELECT pg_current_snapshot()::text, pg_snapshot_xmin(pg_current_snapshot())::text", &[])
        .await
        .map_err(failed)?;
    let position = StreamPosition::Committed {
        xid: xid(now.get(1))?,
        row: FIRST,
        through: None,
        opened: Some(now.get(0)),
        resumed: None,
    };
    Ok(StreamStart { position, gap })
}

/// The events `filter` keeps from `from` on, in the order of their
/// transactions, looking at no more than [`SCAN_MAX`] events besides those
/// passed over as seen before a resume (at most the rows kept, once); the
/// position returned is past every event looked at.
pub async fn read(
    client: &impl GenericClient,
    from: StreamPosition,
    limit: usize,
    filter: &EventFilter,
) -> Result<StreamPage, EngineError> {
    let StreamPosition::Committed { xid: mut at_xid, row: mut at_row, mut through, mut opened, mut resumed } = from
    else {
        let error = crate::job::ValidationError::request(None, "not a position of this backend");
        return Err(EngineError::Invalid { error, index: None });
    };
    let mut events = Vec::new();
    let mut scanned = 0;
    let mut has_more = false;
    'chunks: while scanned < SCAN_MAX {
        // Past the transactions that could have committed before the
        // stream opened, its snapshot decides nothing more.
        if opened
            .as_deref()
            .and_then(|opened| opened.split(':').nth(1)?.parse::<u64>().ok())
            .is_some_and(|xmax| at_xid >= xmax)
        {
            opened = None;
        }
        if resumed.is_some_and(|(up_to, _)| at_xid > up_to) {
            resumed = None;
        }
        // From the row last read on: its events up to `through` are skipped.
        let (from_xid, from_row) = (at_xid.to_string(), at_row.0.to_string());
        // Aliased: ORDER BY must name the columns, not their text.
        let rows = client
            .rows(
                "SELECT xid::text AS xid_text, id::text AS id_text, (extract(epoch FROM at) * 1000)::int8, body \
                 FROM svc_events WHERE (xid, id) >= ($1::text::xid8, $2::text::uuid) \
                   AND xid < pg_snapshot_xmin(pg_current_snapshot()) \
                   AND NOT coalesce(pg_visible_in_snapshot(xid, $4::text::pg_snapshot), false) \
                 ORDER BY xid, id LIMIT $3",
                &[&from_xid, &from_row, &SCAN_CHUNK, &opened],
            )
            .await
            .map_err(failed)?;
        let last_chunk = (rows.len() as i64) < SCAN_CHUNK;
        for row in rows {
            let (row_xid, id): (u64, &str) = (xid(row.get(0))?, row.get(1));
            if row_xid != at_xid {
                through = None;
            }
            (at_xid, at_row) = (row_xid, event_id(id)?);
            for event in decode(id, row.get(2), row.get(3)) {
                if through.is_some_and(|through| event.id.0 <= through.0)
                    || resumed.is_some_and(|(up_to, seen)| row_xid <= up_to && event.id.0 <= seen.0)
                {
                    continue;
                }
                if events.len() == limit || scanned == SCAN_MAX {
                    has_more = true;
                    break 'chunks;
                }
                scanned += 1;
                through = Some(event.id);
                if filter.keeps(&event) {
                    events.push(event);
                }
            }
        }
        if last_chunk {
            break;
        }
    }
    if scanned >= SCAN_MAX {
        has_more = true;
    }
    let position = StreamPosition::Committed { xid: at_xid, row: at_row, through, opened, resumed };
    Ok(StreamPage { events, position, has_more })
}
