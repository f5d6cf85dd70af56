//! The state to and from a snapshot image: taking one on the engine thread
//! ([`State::image`]), rebuilding the state from one in recovery.

use std::sync::Arc;

use super::super::image::StateImage;
use super::super::job_table::LoadedJobs;
use super::{Retention, State};
use crate::job::{Job, SharedPolicies};
use crate::limits::DISPATCH_WINDOW_MS_MAX;

impl State {
    /// The state as an image, jobs in no particular order: cheap enough for
    /// the engine thread (a pointer per job); sorting and encoding can
    /// happen elsewhere.
    pub fn image(&self) -> StateImage {
        let jobs = self.jobs.handles();
        let paused_queues =
            self.queues.iter().filter(|(_, queue)| queue.paused).map(|(name, _)| name.clone()).collect();
        let worker_signals =
            self.worker_signals.iter().map(|(worker, (signal, at))| (worker.clone(), *signal, *at)).collect();
        let crons = self.crons.entries().map(|entry| entry.as_ref().clone()).collect();
        let cron_waiters = self.crons.waiters.iter().map(|(previous, waiting)| (*previous, *waiting)).collect();
        // Claims too old to decide anything are left out, so the image does
        // not depend on when they were last forgotten.
        let since = self.latest_at.saturating_sub(DISPATCH_WINDOW_MS_MAX);
        let dispatch_claims = self
            .dispatch
            .claims_image()
            .into_iter()
            .map(|(key, claims)| (key, claims.into_iter().filter(|at| *at > since).collect::<Vec<_>>()))
            .filter(|(_, claims)| !claims.is_empty())
            .collect();
        let workflows = self.workflows.values().cloned().collect();
        let schemas = self.schemas.values().cloned().collect();
        let webhooks = self.webhooks.values().cloned().collect();
        let deliveries = self.outbox.deliveries().cloned().collect();
        let queue_configs = self
            .queues
            .iter()
            .filter_map(|(name, queue)| queue.backpressure.map(|backpressure| (name.clone(), backpressure)))
            .collect();
        StateImage {
            jobs,
            paused_queues,
            ids: self.ids.clone(),
            reserved: 0,
            worker_signals,
            crons,
            cron_waiters,
            dispatch_claims,
            workflows,
            schemas,
            webhooks,
            deliveries,
            queue_configs,
        }
    }

    /// Rebuilds the state from a snapshot image.
    pub fn from_image(mut image: StateImage, retention: Retention) -> Result<Self, String> {
        let mut state = State::new(retention);
        let mut policies = SharedPolicies::default();
        let mut loaded = LoadedJobs::new(image.jobs.len());
        // Snapshots are written in id order; a job held twice is damage.
        image.jobs.sort_by_key(|job| job.id);
        if let Some(twice) = image.jobs.windows(2).find(|pair| pair[0].id == pair[1].id) {
            return Err(format!("job {} is held twice", twice[0].id));
        }
        for mut job in std::mem::take(&mut image.jobs) {
            if let Some(decoded) = Arc::get_mut(&mut job) {
                policies.share(&mut decoded.retry);
            }
            state.load_job(job, &mut loaded);
        }
        state.store_loaded(loaded);
        state.finish_loading(image)?;
        Ok(state)
    }

    /// Takes one job of the snapshot being loaded into a new state: indexes
    /// it and gathers it into `loaded`, for [`State::store_loaded`] once all
    /// are in (then [`State::finish_loading`]).
    pub(crate) fn load_job(&mut self, job: Arc<Job>, loaded: &mut LoadedJobs) {
        self.note_loaded(&job);
        loaded.push(job);
    }

    /// Stores the jobs of the snapshot being loaded, all at once.
    pub(crate) fn store_loaded(&mut self, loaded: LoadedJobs) {
        self.jobs.store_loaded(loaded);
    }

    /// Takes the rest of the snapshot being loaded: everything of `image`
    /// but its jobs, which came one by one.
    pub(crate) fn finish_loading(&mut self, image: StateImage) -> Result<(), String> {
        let state = self;
        for name in image.paused_queues {
            let queue = state.queues.entry(name.clone()).or_default();
            queue.paused = true;
            Self::queue_changed(&mut state.dirty_queues, &name, queue);
        }
        for (name, backpressure) in image.queue_configs {
            state.set_queue_backpressure(&name, Some(backpressure));
        }
        for (worker, signal, at) in image.worker_signals {
            state.dirty_workers.insert(worker.clone());
            state.worker_signals.insert(worker, (signal, at));
        }
        for entry in image.crons {
            let name = entry.definition.name.clone();
            state.crons.put(entry).map_err(|error| format!("snapshot cron entry {name}: {error}"))?;
        }
        state.crons.waiters = image.cron_waiters.into_iter().collect();
        for (key, claims) in image.dispatch_claims {
            state.dispatch.load_claims(key, claims);
        }
        for workflow in image.workflows {
            state.ids.observe(workflow.id.0);
            for callback in &workflow.callbacks {
                state.ids.observe(callback.job.id);
            }
            if let Some(ended_at) = workflow.ended_at {
                state.terminal_workflows.insert((ended_at, workflow.id));
                state.terminal_workflow_bytes += workflow.held_bytes();
            }
            state.highest_stored_id = state.highest_stored_id.max(workflow.id.0);
            state.workflows.insert(workflow.id, workflow);
        }
        for subscription in image.webhooks {
            state.ids.observe(subscription.id.0);
            state.webhooks.insert(subscription.id, subscription);
        }
        let mut previous: Option<Arc<super::super::webhooks::outbox::Delivery>> = None;
        for mut delivery in image.deliveries {
            super::super::webhooks::outbox::share_body(previous.as_ref(), &mut delivery);
            state.outbox.insert(delivery.clone()).map_err(|problem| format!("snapshot: {problem}"))?;
            previous = Some(delivery);
        }
        for entry in image.schemas {
            state.schemas.insert(entry.uri.clone(), entry);
        }
        state.ids = image.ids;
        Ok(())
    }
}
