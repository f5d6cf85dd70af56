//! Discovery and probes: health, ready, the error catalogue and the
//! manifest (docs/api.md, "Discovery and probes").

use hyper::StatusCode;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

use super::error::ApiError;
use super::{AppState, Reply, SPEC_VERSION};
use crate::engine::ERROR_CODES;
use crate::limits::{
    BATCH_JOBS_MAX, ENVELOPE_BYTES_MAX, FETCH_COUNT_MAX, HEALTH_PROBE_MS, PAGE_SIZE_DEFAULT, PAGE_SIZE_MAX,
};

pub(super) async fn health(app: &AppState) -> Result<Reply, ApiError> {
    let started = Instant::now();
    let probe = tokio::time::timeout(Duration::from_millis(HEALTH_PROBE_MS), app.backend.probe().outcome()).await;
    let latency_ms = started.elapsed().as_millis() as u64;
    let problem = if let Some(failure) = app.backend.failure() {
        Some(failure.code())
    } else if app.backend.disk_full() {
        Some("disk_full")
    } else {
        match probe {
            Ok(Ok(())) => None,
            Ok(Err(_)) => Some("sync_failed"),
            Err(_) => Some("probe_timeout"),
        }
    };
    let uptime_seconds = app.started.elapsed().as_secs();
    let (status, backend) = match problem {
        None => ("ok", json!({"type": "wal", "status": "ok", "latency_ms": latency_ms})),
        Some(error) => {
            ("unhealthy", json!({"type": "wal", "status": "unhealthy", "latency_ms": latency_ms, "error": error}))
        }
    };
    let body = json!({"status": status, "version": SPEC_VERSION, "uptime_seconds": uptime_seconds, "backend": backend})
        .to_string();
    Ok(match problem {
        None => Reply::ok(body),
        Some(_) => {
            Reply::ok(body).with_status(StatusCode::SERVICE_UNAVAILABLE).header(hyper::header::RETRY_AFTER, "1".into())
        }
    })
}

pub(super) fn ready(app: &AppState) -> Result<Reply, ApiError> {
    let reason = if app.is_shutting_down() {
        Some("shutting_down")
    } else if app.backend.failure().is_some() {
        Some("backend_unavailable")
    } else {
        None
    };
    Ok(match reason {
        None => Reply::ok(json!({"status": "ready"}).to_string()),
        Some(reason) => Reply::ok(json!({"status": "not_ready", "reason": reason}).to_string())
            .with_status(StatusCode::SERVICE_UNAVAILABLE)
            .header(hyper::header::RETRY_AFTER, "1".into()),
    })
}

pub(super) fn error_catalog() -> Value {
    let errors: Vec<Value> = ERROR_CODES
        .iter()
        .map(|(code, status, retryable, meaning, _)| json!({"code": code, "status": status, "retryable": retryable, "meaning": meaning}))
        .collect();
    json!({"errors": errors})
}

/// The OpenAPI 3.1 description of every route (`docs/openapi.json`).
pub(super) const OPENAPI: &str = include_str!("../../docs/openapi.json");

/// What this build implements (docs/api.md, "Discovery and probes"): levels
/// 0 to 4 of the interface, the schema registry and webhooks.
pub(super) fn manifest(app: &AppState) -> Value {
    json!({
        "specversion": SPEC_VERSION,
        "implementation": "svc",
        "implementation_version": env!("CARGO_PKG_VERSION"),
        "conformance_level": 4,
        "conformance": {"level": 4, "tier": "runtime"},
        "features": {
            "batch_enqueue": true, "dead_letter": true, "cron": true, "workflows": true,
            "unique_jobs": true, "priority": true, "schemas": true, "webhooks": true,
            "events": true, "rate_limiting": true, "worker_signals": true
        },
        "extensions": [{"name": "retry", "version": "1.0.0"}, {"name": "dead-letter", "version": "1.0.0"}, {"name": "events", "version": "1.0.0"}, {"name": "cron", "version": "1.0.0"}, {"name": "unique-jobs", "version": "1.0.0"}, {"name": "workflows", "version": "1.0.0"}, {"name": "schema-registry", "version": "1.0.0"}, {"name": "webhooks", "version": "1.0.0"}],
        "protocols": ["http"],
        "backend": "wal",
        "unique_job_strength": "strong",
        "authentication": if app.auth.is_enabled() {
            json!({"schemes": ["bearer"], "required": true})
        } else {
            json!({"schemes": [], "required": false})
        },
        "limits": {
            "max_envelope_bytes": ENVELOPE_BYTES_MAX, "max_meta_bytes": crate::limits::META_BYTES_MAX,
            "max_batch_jobs": BATCH_JOBS_MAX, "max_fetch_count": FETCH_COUNT_MAX,
            "default_page_size": PAGE_SIZE_DEFAULT, "max_page_size": PAGE_SIZE_MAX
        }
    })
}

/// `GET /metrics`: the Prometheus text format (docs/api.md, "Metrics").
pub(super) async fn metrics(app: &AppState) -> Result<Reply, ApiError> {
    let (queues, _) = app.backend.queues_page(None, crate::metrics::QUEUE_LABELS_MAX).outcome().await?;
    let queues: Vec<crate::metrics::QueueGauge> = queues
        .into_iter()
        .map(|queue| {
            let counts = crate::job::JobState::ALL.iter().map(|state| (state.as_str(), queue.count(*state))).collect();
            crate::metrics::QueueGauge { name: queue.name, paused: queue.paused, counts }
        })
        .collect();
    let now = crate::clock::Clock::now_ms(app.clock.as_ref());
    let mut workers = [("running", 0u64), ("quiet", 0), ("terminate", 0), ("stale", 0)];
    let mut after: Option<String> = None;
    loop {
        let (page, more) =
            app.backend.workers_page(after.clone(), crate::limits::PAGE_SIZE_MAX, None).outcome().await?;
        for entry in &page {
            let slot = if now - entry.last_seen_at > crate::limits::WORKER_STALE_MS {
                3
            } else {
                match entry.state {
                    crate::engine::WorkerState::Running => 0,
                    crate::engine::WorkerState::Quiet => 1,
                    crate::engine::WorkerState::Terminate => 2,
                }
            };
            workers[slot].1 += 1;
        }
        match (more, page.last()) {
            (true, Some(last)) => after = Some(last.worker_id.clone()),
            _ => break,
        }
    }
    let text = app.metrics.render(&queues, &workers);
    Ok(Reply::ok(text).header(hyper::header::CONTENT_TYPE, "text/plain".to_string()))
}
