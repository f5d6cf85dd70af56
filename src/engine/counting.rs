//! Counting what events say happened into the metrics (docs/api.md,
//! "Metrics"): job transitions by queue, how long jobs waited and ran, cron
//! fires and skips. The local engine counts each turn's events on its
//! thread; the PostgreSQL backend's leader counts committed events once
//! each as it reads them.

use crate::clock::Millis;
use crate::job::{Job, QueueName};
use crate::metrics::{JobCount, Metrics};

use super::events::EventKind;

/// Counts events; job transitions a run at a time: events mostly come in
/// runs of one kind in one queue (a batch enqueue's), and a counter is
/// looked up by its labels once per run instead of once per job.
/// [`EventCounter::flush`] ends the last run.
#[derive(Default)]
pub struct EventCounter {
    run: Option<(JobCount, QueueName, u64)>,
}

impl EventCounter {
    /// Counts one event, of `time`, about `job` as right after it.
    pub fn count(&mut self, metrics: &Metrics, time: Millis, kind: &EventKind, job: Option<&Job>) {
        self.count_in(metrics, time, kind, job.map(|job| &job.queue), job);
    }

    /// Whether counting `kind` reads the job itself (its times), not only
    /// its queue.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub fn needs_job(kind: &EventKind) -> bool {
        matches!(kind, EventKind::Started | EventKind::Completed)
    }

    /// Counts one event of a job in `queue`; `job` is needed only where
    /// [`EventCounter::needs_job`] says so.
    pub fn count_in(
        &mut self,
        metrics: &Metrics,
        time: Millis,
        kind: &EventKind,
        queue: Option<&QueueName>,
        job: Option<&Job>,
    ) {
        let seconds = |from: Option<Millis>| from.map(|from| (time - from).max(0) as f64 / 1000.0);
        match kind {
            EventKind::CronTriggered { .. } => return metrics.cron_fires.inc(),
            EventKind::CronSkipped(skip) => return metrics.cron_skip(skip.reason),
            _ => {}
        }
        let Some(queue) = queue else { return };
        let count = match kind {
            EventKind::Enqueued | EventKind::Revived => JobCount::Enqueued,
            EventKind::Started => {
                if let Some(waited) = seconds(job.and_then(|job| job.enqueued_at())) {
                    metrics.job_wait(queue, waited);
                }
                return;
            }
            EventKind::Completed => {
                if let Some(ran) = seconds(job.and_then(|job| job.run().started_at)) {
                    metrics.job_duration(queue, ran);
                }
                JobCount::Completed
            }
            EventKind::Failed { .. } => JobCount::Failed,
            EventKind::Retrying { .. } => JobCount::Retried,
            EventKind::Discarded { .. } => JobCount::Discarded,
            EventKind::Cancelled { .. } => JobCount::Cancelled,
            EventKind::Expired => JobCount::Expired,
            _ => return,
        };
        self.add(metrics, count, queue);
    }

    fn add(&mut self, metrics: &Metrics, kind: JobCount, queue: &QueueName) {
        match &mut self.run {
            Some((run_kind, run_queue, count)) if *run_kind == kind && run_queue == queue => *count += 1,
            _ => {
                self.flush(metrics);
                self.run = Some((kind, queue.clone(), 1));
            }
        }
    }

    /// Counts the run in hand.
    pub fn flush(&mut self, metrics: &Metrics) {
        if let Some((kind, queue, count)) = self.run.take() {
            metrics.jobs(kind, &queue, count);
        }
    }
}
