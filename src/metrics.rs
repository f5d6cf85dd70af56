//! Prometheus metrics (docs/api.md, "Metrics"): what the HTTP front end and
//! the engine count, and the text `GET /metrics` serves.
//!
//! Counting stays off the hot path's locks: the engine counts on its own
//! thread (job events by queue, commits, syncs, snapshots); a request bumps
//! a counter and a histogram it found once per route and status and keeps
//! in a fixed table, each an atomic update. Gauges of the current state
//! (queues, workers) are read when the text is rendered.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use std::collections::HashSet;
use std::sync::OnceLock;

/// Most distinct `queue` label values; later queues count under `other`.
pub const QUEUE_LABELS_MAX: usize = 1000;

/// The statuses counted under their own value; others under `other`.
const STATUSES: [u16; 15] = [200, 201, 400, 401, 403, 404, 405, 409, 413, 422, 429, 500, 503, 504, 0];

/// Routes a request can be counted under (the router's templates, and
/// `unknown` for a path it does not know).
pub const ROUTES_MAX: usize = 96;

pub struct Metrics {
    registry: Registry,
    http_requests: IntCounterVec,
    http_duration: HistogramVec,
    /// Per (route, status): the counter, made on first use.
    request_counters: Vec<OnceLock<IntCounter>>,
    /// Per route: the duration histogram, made on first use.
    request_durations: Vec<OnceLock<Histogram>>,
    /// `svc_jobs_<kind>_total`, by `JobCount` index.
    jobs: Vec<IntCounterVec>,
    job_duration: HistogramVec,
    job_wait: HistogramVec,
    queue_labels: parking_lot::Mutex<HashSet<String>>,
    pub cron_fires: IntCounter,
    cron_skips: IntCounterVec,
    pub rate_limited: IntCounter,
    pub commit_jobs: Histogram,
    pub sync_seconds: Histogram,
    pub inbox_depth: IntGauge,
    /// Engine turns (a turn wakes for commands or for a deadline).
    pub engine_turns: IntCounter,
    pub snapshot_seconds: Histogram,
    pub recovery_seconds: prometheus::Gauge,
    queue_jobs: IntGaugeVec,
    queue_paused: IntGaugeVec,
    workers: IntGaugeVec,
    webhook_deliveries: IntCounterVec,
    /// Webhook deliveries queued (engine thread sets it after each commit).
    pub webhook_pending: IntGauge,
    /// How long started attempts waited for the delivery thread to take them.
    pub webhook_handoff_seconds: Histogram,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// One queue's gauges: whether it is paused, and its jobs by state name.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueGauge {
    pub name: String,
    pub paused: bool,
    pub counts: Vec<(&'static str, u64)>,
}

/// What a job event counts as, in `svc_jobs_<kind>_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobCount {
    Enqueued,
    Completed,
    Failed,
    Retried,
    Discarded,
    Cancelled,
    Expired,
}

impl JobCount {
    pub const ALL: [JobCount; 7] = [
        JobCount::Enqueued,
        JobCount::Completed,
        JobCount::Failed,
        JobCount::Retried,
        JobCount::Discarded,
        JobCount::Cancelled,
        JobCount::Expired,
    ];

    fn name(self) -> &'static str {
        match self {
            JobCount::Enqueued => "enqueued",
            JobCount::Completed => "completed",
            JobCount::Failed => "failed",
            JobCount::Retried => "retried",
            JobCount::Discarded => "discarded",
            JobCount::Cancelled => "cancelled",
            JobCount::Expired => "expired",
        }
    }
}

fn seconds_buckets() -> Vec<f64> {
    vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0]
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("a valid metric");
            registry.register(Box::new(metric.clone())).expect("registered once");
            metric
        };
        let histogram_vec = |name: &str, help: &str, labels: &[&str]| {
            let opts = HistogramOpts::new(name, help).buckets(seconds_buckets());
            let metric = HistogramVec::new(opts, labels).expect("a valid metric");
            registry.register(Box::new(metric.clone())).expect("registered once");
            metric
        };
        let histogram = |name: &str, help: &str, buckets: Vec<f64>| {
            let metric = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("a valid metric");
            registry.register(Box::new(metric.clone())).expect("registered once");
            metric
        };
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            let metric = IntGaugeVec::new(Opts::new(name, help), labels).expect("a valid metric");
            registry.register(Box::new(metric.clone())).expect("registered once");
            metric
        };
        let counter = |name: &str, help: &str| {
            let metric = IntCounter::new(name, help).expect("a valid metric");
            registry.register(Box::new(metric.clone())).expect("registered once");
            metric
        };
        let http_requests =
            counter_vec("svc_http_requests_total", "HTTP requests answered", &["method", "route", "status"]);
        let http_duration =
            histogram_vec("svc_http_request_duration_seconds", "Time to answer an HTTP request", &["route"]);
        let jobs = JobCount::ALL
            .iter()
            .map(|kind| {
                let name = format!("svc_jobs_{}_total", kind.name());
                counter_vec(&name, &format!("Jobs {} (failed: attempts), by queue", kind.name()), &["queue"])
            })
            .collect();
        let job_duration = histogram_vec("svc_job_duration_seconds", "From claim to completion", &["queue"]);
        let job_wait = histogram_vec("svc_job_wait_seconds", "From available to claimed", &["queue"]);
        let cron_fires = counter("svc_cron_fires_total", "Cron entries fired");
        let cron_skips = counter_vec("svc_cron_skips_total", "Cron evaluations that created nothing", &["reason"]);
        let rate_limited = counter("svc_rate_limited_total", "Requests refused by the request rate limit");
        let commit_jobs = histogram(
            "svc_engine_commit_records",
            "Records made durable by one commit (group commit batch size)",
            vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0],
        );
        let sync_seconds = histogram("svc_engine_sync_seconds", "Time to write and sync one commit", seconds_buckets());
        let inbox_depth =
            IntGauge::new("svc_engine_inbox_depth", "Commands taken by the last engine turn").expect("a valid metric");
        registry.register(Box::new(inbox_depth.clone())).expect("registered once");
        let engine_turns = counter("svc_engine_turns_total", "Engine turns, for commands or for a deadline");
        let snapshot_seconds =
            histogram("svc_engine_snapshot_seconds", "Time to encode and write a snapshot", seconds_buckets());
        let recovery_seconds =
            prometheus::Gauge::new("svc_engine_recovery_seconds", "Time the last start spent recovering the data dir")
                .expect("a valid metric");
        registry.register(Box::new(recovery_seconds.clone())).expect("registered once");
        let queue_jobs = gauge_vec("svc_queue_jobs", "Jobs held by queue and state", &["queue", "state"]);
        let queue_paused = gauge_vec("svc_queue_paused", "1 while a queue is paused", &["queue"]);
        let workers = gauge_vec("svc_workers", "Workers in the registry by state", &["state"]);
        let webhook_deliveries = counter_vec(
            "svc_webhook_deliveries_total",
            "Webhook delivery attempts and ends by result (success, failure, abandoned, blocked, dropped)",
            &["result"],
        );
        let webhook_pending =
            IntGauge::new("svc_webhook_pending", "Webhook deliveries queued").expect("a valid metric");
        registry.register(Box::new(webhook_pending.clone())).expect("registered once");
        let webhook_handoff_seconds = histogram(
            "svc_webhook_handoff_seconds",
            "Time from the engine starting webhook attempts to the delivery thread taking them",
            seconds_buckets(),
        );
        Metrics {
            registry,
            http_requests,
            http_duration,
            request_counters: (0..ROUTES_MAX * STATUSES.len()).map(|_| OnceLock::new()).collect(),
            request_durations: (0..ROUTES_MAX).map(|_| OnceLock::new()).collect(),
            jobs,
            job_duration,
            job_wait,
            queue_labels: parking_lot::Mutex::new(HashSet::new()),
            cron_fires,
            cron_skips,
            rate_limited,
            commit_jobs,
            sync_seconds,
            inbox_depth,
            engine_turns,
            snapshot_seconds,
            recovery_seconds,
            queue_jobs,
            queue_paused,
            workers,
            webhook_deliveries,
            webhook_pending,
            webhook_handoff_seconds,
        }
    }

    /// Counts a webhook attempt's or delivery's `result` (a fixed set of values).
    pub fn webhook_delivery(&self, result: &'static str) {
        self.webhook_deliveries.with_label_values(&[result]).inc();
    }

    /// Counts one answered request: `route` is its index and template
    /// (below [`ROUTES_MAX`]), `method` its method.
    pub fn request(&self, route: (usize, &'static str), method: &'static str, status: u16, seconds: f64) {
        let (index, template) = route;
        let index = index.min(ROUTES_MAX - 1);
        let slot = STATUSES.iter().position(|known| *known == status).unwrap_or(STATUSES.len() - 1);
        let counter = self.request_counters[index * STATUSES.len() + slot].get_or_init(|| {
            let status = if STATUSES[slot] == 0 { "other".to_string() } else { STATUSES[slot].to_string() };
            self.http_requests.with_label_values(&[method, template, status.as_str()])
        });
        counter.inc();
        let histogram = self.request_durations[index].get_or_init(|| self.http_duration.with_label_values(&[template]));
        histogram.observe(seconds);
    }

    /// The label a queue is counted under (engine thread; bounded).
    fn queue_label<'a>(&self, queue: &'a str) -> &'a str {
        let mut known = self.queue_labels.lock();
        if known.contains(queue) {
            return queue;
        }
        if known.len() < QUEUE_LABELS_MAX {
            known.insert(queue.to_string());
            return queue;
        }
        "other"
    }

    /// Counts `count` job transitions of one kind in one queue (engine thread).
    pub fn jobs(&self, kind: JobCount, queue: &str, count: u64) {
        let queue = self.queue_label(queue);
        self.jobs[kind as usize].with_label_values(&[queue]).inc_by(count);
    }

    /// A claim ended in completion after `seconds` (engine thread).
    pub fn job_duration(&self, queue: &str, seconds: f64) {
        let queue = self.queue_label(queue);
        self.job_duration.with_label_values(&[queue]).observe(seconds);
    }

    /// A job waited `seconds` between becoming available and its claim.
    pub fn job_wait(&self, queue: &str, seconds: f64) {
        let queue = self.queue_label(queue);
        self.job_wait.with_label_values(&[queue]).observe(seconds);
    }

    pub fn cron_skip(&self, reason: &str) {
        self.cron_skips.with_label_values(&[reason]).inc();
    }

    /// The text format, with the current queues' and workers' gauges set
    /// from `queues` (name, paused, count per state name) and `workers`
    /// (state name, count).
    pub fn render(&self, queues: &[QueueGauge], workers: &[(&'static str, u64)]) -> String {
        self.queue_jobs.reset();
        self.queue_paused.reset();
        self.workers.reset();
        for queue in queues.iter().take(QUEUE_LABELS_MAX) {
            self.queue_paused.with_label_values(&[queue.name.as_str()]).set(i64::from(queue.paused));
            for (state, count) in &queue.counts {
                self.queue_jobs.with_label_values(&[queue.name.as_str(), state]).set(*count as i64);
            }
        }
        for (state, count) in workers {
            self.workers.with_label_values(&[state]).set(*count as i64);
        }
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out).expect("text encoding into a Vec");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_show_in_the_text_with_bounded_labels() {
        let metrics = Metrics::new();
        metrics.request((3, "/svc/v1/jobs"), "POST", 201, 0.002);
        metrics.request((3, "/svc/v1/jobs"), "POST", 201, 0.004);
        metrics.request((3, "/svc/v1/jobs"), "POST", 599, 0.004);
        metrics.jobs(JobCount::Enqueued, "mail", 1);
        let mail = QueueGauge { name: "mail".into(), paused: true, counts: vec![("available", 2)] };
        let text = metrics.render(&[mail], &[("running", 1)]);
        assert!(
            text.contains(r#"svc_http_requests_total{method="POST",route="/svc/v1/jobs",status="201"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"status="other"} 1"#));
        assert!(text.contains(r#"svc_jobs_enqueued_total{queue="mail"} 1"#));
        assert!(text.contains(r#"svc_queue_jobs{queue="mail",state="available"} 2"#));
        assert!(text.contains(r#"svc_queue_paused{queue="mail"} 1"#));
        assert!(text.contains(r#"svc_workers{state="running"} 1"#));
        for n in 0..QUEUE_LABELS_MAX + 5 {
            metrics.jobs(JobCount::Completed, &format!("q{n}"), 1);
        }
        let text = metrics.render(&[], &[]);
        assert!(text.contains(r#"svc_jobs_completed_total{queue="other"} 6"#), "past the bound, queues count as other");
    }
}
