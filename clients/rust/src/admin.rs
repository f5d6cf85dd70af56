//! Workflows, cron entries, queues, the dead letter listing, webhook
//! subscriptions, the worker registry and schemas: each a borrowed view of
//! the [`Client`] (`client.cron().register(…)`).

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::client::{Client, ListOptions, encode};
use crate::enqueue::Enqueue;
use crate::error::Result;
use crate::http::Call;
use crate::types::{
    CronEntry, Job, Page, QueueStats, QueueSummary, Subscription, WebhookTestResult, WorkerInfo, Workflow,
};

impl Client {
    /// Chains, groups and batches of jobs.
    pub fn workflows(&self) -> Workflows<'_> {
        Workflows { client: self }
    }

    /// Cron entries.
    pub fn cron(&self) -> Cron<'_> {
        Cron { client: self }
    }

    /// Queues: sizes, stats, pause and resume.
    pub fn queues(&self) -> Queues<'_> {
        Queues { client: self }
    }

    /// Jobs that failed for good (`discarded`), newest first.
    pub fn dead_letter(&self) -> DeadLetter<'_> {
        DeadLetter { client: self }
    }

    /// Webhook subscriptions.
    pub fn webhooks(&self) -> Webhooks<'_> {
        Webhooks { client: self }
    }

    /// The worker registry and its signals.
    pub fn workers(&self) -> Workers<'_> {
        Workers { client: self }
    }

    /// Registered JSON Schemas for `args`.
    pub fn schemas(&self) -> Schemas<'_> {
        Schemas { client: self }
    }

    /// Recent events (`GET /events`), oldest first; `types` filters by
    /// type (exact, `prefix.*`), `after` pages on from an event id.
    pub async fn events(&self, types: &[&str], after: Option<&str>, limit: Option<u32>) -> Result<Page<Value>> {
        let options = ListOptions { limit, cursor: None };
        let types = (!types.is_empty()).then(|| types.join(","));
        self.list("/events", "events", &options, vec![("types", types), ("after", after.map(str::to_string))]).await
    }
}

#[derive(Deserialize)]
struct WorkflowBody {
    workflow: Workflow,
}

/// A workflow to create: a chain, a group or a batch of jobs.
#[derive(Debug, Clone)]
#[must_use]
pub struct WorkflowSpec {
    kind: &'static str,
    jobs: Vec<Enqueue>,
    callbacks: Vec<(&'static str, Enqueue)>,
    name: Option<String>,
    defaults: Option<Enqueue>,
}

impl WorkflowSpec {
    /// Runs `steps` one after the other; each step gets the results of the
    /// steps before it ([`Job::parent_results`]).
    pub fn chain(steps: Vec<Enqueue>) -> WorkflowSpec {
        WorkflowSpec { kind: "chain", jobs: steps, callbacks: Vec::new(), name: None, defaults: None }
    }

    /// Runs `jobs` at once.
    pub fn group(jobs: Vec<Enqueue>) -> WorkflowSpec {
        WorkflowSpec { kind: "group", jobs, callbacks: Vec::new(), name: None, defaults: None }
    }

    /// Runs `jobs` at once, then fires callbacks once every one has ended
    /// (give at least one of [`on_complete`](Self::on_complete),
    /// [`on_success`](Self::on_success), [`on_failure`](Self::on_failure)).
    pub fn batch(jobs: Vec<Enqueue>) -> WorkflowSpec {
        WorkflowSpec { kind: "batch", jobs, callbacks: Vec::new(), name: None, defaults: None }
    }

    /// A batch's callback fired once every job ended.
    pub fn on_complete(mut self, job: Enqueue) -> WorkflowSpec {
        self.callbacks.push(("on_complete", job));
        self
    }

    /// A batch's callback fired when no job failed.
    pub fn on_success(mut self, job: Enqueue) -> WorkflowSpec {
        self.callbacks.push(("on_success", job));
        self
    }

    /// A batch's callback fired when a job failed.
    pub fn on_failure(mut self, job: Enqueue) -> WorkflowSpec {
        self.callbacks.push(("on_failure", job));
        self
    }

    /// The workflow's name (at most 255 characters).
    pub fn name(mut self, name: impl Into<String>) -> WorkflowSpec {
        self.name = Some(name.into());
        self
    }

    /// Defaults for every job: the options (queue, priority, retry, …) and
    /// `meta` of `defaults` (its type and arguments are not used); a job's
    /// own settings win.
    pub fn defaults(mut self, defaults: Enqueue) -> WorkflowSpec {
        self.defaults = Some(defaults);
        self
    }

    fn to_json(&self) -> Result<Value> {
        let member = |job: &Enqueue| -> Result<Value> { job.to_json() };
        let jobs = self.jobs.iter().map(member).collect::<Result<Vec<_>>>()?;
        let mut definition = Map::new();
        definition.insert("type".into(), json!(self.kind));
        definition.insert(if self.kind == "chain" { "steps" } else { "jobs" }.into(), Value::Array(jobs));
        if !self.callbacks.is_empty() {
            let mut callbacks = Map::new();
            for (name, job) in &self.callbacks {
                callbacks.insert((*name).into(), member(job)?);
            }
            definition.insert("callbacks".into(), Value::Object(callbacks));
        }
        if let Some(defaults) = &self.defaults {
            let body = defaults.to_json()?;
            let mut options = body.get("options").and_then(Value::as_object).cloned().unwrap_or_default();
            if let Some(meta) = body.get("meta") {
                options.insert("metadata".into(), meta.clone());
            }
            if !options.is_empty() {
                definition.insert("options".into(), Value::Object(options));
            }
        }
        let mut body = Map::new();
        body.insert("definition".into(), Value::Object(definition));
        if let Some(name) = &self.name {
            body.insert("name".into(), json!(name));
        }
        Ok(Value::Object(body))
    }
}

/// Chains, groups and batches: [`Client::workflows`].
pub struct Workflows<'a> {
    client: &'a Client,
}

impl Workflows<'_> {
    /// Creates a workflow, all or nothing (`POST /workflows`). Retried
    /// after an unclear failure only when every job has a client-chosen id:
    /// then a retry that meets the first job answers its workflow.
    pub async fn create(&self, spec: WorkflowSpec) -> Result<Workflow> {
        let ids: Vec<Option<String>> = spec.jobs.iter().map(|job| job.job_id().map(str::to_string)).collect();
        let all_ids = !ids.is_empty() && ids.iter().all(Option::is_some);
        let call = Call::post("/workflows").json(&spec.to_json()?)?.idempotent(all_ids);
        match self.client.call::<WorkflowBody>(call).await {
            Ok(answer) => Ok(answer.workflow),
            Err(error) => {
                if let Some(api) = error.api()
                    && api.maybe_applied
                    && all_ids
                    && api.code == "duplicate"
                    && api.reason() != Some("unique_conflict")
                {
                    let index = api.details.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                    if let Some(Some(id)) = ids.get(index)
                        && api.existing_job_id() == Some(id.as_str())
                    {
                        let job = self.client.get(id).await?;
                        if let Some(workflow) = job.workflow_id {
                            return self.get(&workflow).await;
                        }
                    }
                }
                Err(error)
            }
        }
    }

    /// `create(WorkflowSpec::chain(steps))`.
    pub async fn chain(&self, steps: Vec<Enqueue>) -> Result<Workflow> {
        self.create(WorkflowSpec::chain(steps)).await
    }

    /// `create(WorkflowSpec::group(jobs))`.
    pub async fn group(&self, jobs: Vec<Enqueue>) -> Result<Workflow> {
        self.create(WorkflowSpec::group(jobs)).await
    }

    /// Reads a workflow and its jobs' states.
    pub async fn get(&self, id: &str) -> Result<Workflow> {
        Ok(self.client.call::<WorkflowBody>(Call::get(format!("/workflows/{}", encode(id)))).await?.workflow)
    }

    /// Cancels a running workflow and every job of it not yet ended.
    pub async fn cancel(&self, id: &str) -> Result<Workflow> {
        match self.client.call::<WorkflowBody>(Call::delete(format!("/workflows/{}", encode(id)))).await {
            Ok(answer) => Ok(answer.workflow),
            Err(error) if error.maybe_applied() && error.is_conflict() => {
                let workflow = self.get(id).await?;
                if workflow.state == "cancelled" { Ok(workflow) } else { Err(error) }
            }
            Err(error) => Err(error),
        }
    }
}

/// A cron entry to register (docs/api.md, "Cron").
#[derive(Debug, Clone)]
#[must_use]
pub struct CronSpec {
    job: Enqueue,
    fields: Map<String, Value>,
}

impl CronSpec {
    /// An entry named `name` firing `job` on the five-field `schedule`
    /// (`0 2 * * *`, `@daily`) in UTC; `job`'s type, arguments, `meta` and
    /// options (queue, priority, retry, …) make each fired job.
    pub fn new(name: impl Into<String>, schedule: impl Into<String>, job: Enqueue) -> CronSpec {
        let mut fields = Map::new();
        fields.insert("name".into(), Value::String(name.into()));
        fields.insert("schedule".into(), Value::String(schedule.into()));
        CronSpec { job, fields }
    }

    /// An IANA time zone (`Europe/Berlin`; default `UTC`).
    pub fn timezone(self, timezone: impl Into<String>) -> CronSpec {
        self.field("timezone", Value::String(timezone.into()))
    }

    /// `skip` (default), `allow`, `cancel_previous` or `enqueue`.
    pub fn overlap_policy(self, policy: impl Into<String>) -> CronSpec {
        self.field("overlap_policy", Value::String(policy.into()))
    }

    pub fn enabled(self, enabled: bool) -> CronSpec {
        self.field("enabled", Value::Bool(enabled))
    }

    pub fn description(self, description: impl Into<String>) -> CronSpec {
        self.field("description", Value::String(description.into()))
    }

    /// Any other field, as JSON.
    pub fn field(mut self, key: impl Into<String>, value: Value) -> CronSpec {
        self.fields.insert(key.into(), value);
        self
    }

    fn to_json(&self) -> Result<Value> {
        let mut body = self.fields.clone();
        if let Value::Object(mut job) = self.job.to_json()? {
            for key in ["type", "args", "meta", "options", "schema"] {
                if let Some(value) = job.remove(key) {
                    body.insert(key.into(), value);
                }
            }
        }
        Ok(Value::Object(body))
    }
}

#[derive(Deserialize)]
struct CronBody {
    cron: CronEntry,
}

/// Cron entries: [`Client::cron`].
pub struct Cron<'a> {
    client: &'a Client,
}

impl Cron<'_> {
    /// Registers an entry, or replaces the one of its name (`POST /cron`).
    pub async fn register(&self, spec: CronSpec) -> Result<CronEntry> {
        let call = Call::post("/cron").json(&spec.to_json()?)?.idempotent(true);
        Ok(self.client.call::<CronBody>(call).await?.cron)
    }

    pub async fn get(&self, name: &str) -> Result<CronEntry> {
        Ok(self.client.call::<CronBody>(Call::get(format!("/cron/{}", encode(name)))).await?.cron)
    }

    /// A page of entries, by name.
    pub async fn list(&self, options: &ListOptions) -> Result<Page<CronEntry>> {
        self.client.list("/cron", "crons", options, Vec::new()).await
    }

    /// Changes fields of an entry (`PATCH /cron/{name}`), e.g. `{"enabled": false}`.
    pub async fn update(&self, name: &str, patch: Value) -> Result<CronEntry> {
        let call = Call::new(reqwest::Method::PATCH, format!("/cron/{}", encode(name))).json(&patch)?.idempotent(true);
        Ok(self.client.call::<CronBody>(call).await?.cron)
    }

    /// Removes an entry; the jobs it created stay.
    pub async fn delete(&self, name: &str) -> Result<CronEntry> {
        Ok(self.client.call::<CronBody>(Call::delete(format!("/cron/{}", encode(name)))).await?.cron)
    }
}

/// Queues: [`Client::queues`].
pub struct Queues<'a> {
    client: &'a Client,
}

#[derive(Deserialize)]
struct PausedBody {
    paused: bool,
}

impl Queues<'_> {
    /// A page of queues, by name.
    pub async fn list(&self, options: &ListOptions) -> Result<Page<QueueSummary>> {
        self.client.list("/queues", "queues", options, Vec::new()).await
    }

    /// A queue's jobs by state and its last minute.
    pub async fn stats(&self, name: &str) -> Result<QueueStats> {
        self.client.call(Call::get(format!("/queues/{}/stats", encode(name)))).await
    }

    /// Pauses a queue: fetches skip it, enqueues into it get 503 `queue_paused`.
    /// Answers whether it is paused.
    pub async fn pause(&self, name: &str) -> Result<bool> {
        let call = Call::post(format!("/queues/{}/pause", encode(name))).idempotent(true);
        Ok(self.client.call::<PausedBody>(call).await?.paused)
    }

    /// Resumes a paused queue; answers whether it is paused.
    pub async fn resume(&self, name: &str) -> Result<bool> {
        let call = Call::post(format!("/queues/{}/resume", encode(name))).idempotent(true);
        Ok(self.client.call::<PausedBody>(call).await?.paused)
    }
}

/// The dead letter listing: [`Client::dead_letter`].
pub struct DeadLetter<'a> {
    client: &'a Client,
}

#[derive(Deserialize)]
struct JobBody {
    job: Job,
}

impl DeadLetter<'_> {
    /// A page of discarded jobs, newest first, of one queue or all.
    pub async fn list(&self, queue: Option<&str>, options: &ListOptions) -> Result<Page<Job>> {
        self.client.list("/dead-letter", "jobs", options, vec![("queue", queue.map(str::to_string))]).await
    }

    /// Every discarded job of one queue or all, page after page.
    pub async fn all(&self, queue: Option<&str>) -> Result<Vec<Job>> {
        let mut jobs = Vec::new();
        let mut options = ListOptions::new().limit(100);
        loop {
            let page = self.list(queue, &options).await?;
            jobs.extend(page.items);
            match page.cursor {
                Some(cursor) if page.has_more => options.cursor = Some(cursor),
                _ => return Ok(jobs),
            }
        }
    }

    /// Sends a discarded job back to `available`, its attempts reset.
    pub async fn retry(&self, id: &str) -> Result<Job> {
        let call = Call::post(format!("/dead-letter/{}/retry", encode(id))).idempotent(true);
        Ok(self.client.call::<JobBody>(call).await?.job)
    }

    /// Removes a discarded job.
    pub async fn delete(&self, id: &str) -> Result<()> {
        self.client.send(Call::delete(format!("/dead-letter/{}", encode(id)))).await.map(drop)
    }
}

/// A webhook subscription to create.
#[derive(Debug, Clone)]
#[must_use]
pub struct WebhookSpec {
    body: Map<String, Value>,
}

impl WebhookSpec {
    /// Sends the events matching `events` (`job.completed`, `job.*`, `*`)
    /// to the HTTPS `url`, signed with `secret` (16 to 256 characters).
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(
        url: impl Into<String>,
        events: I,
        secret: impl Into<String>,
    ) -> WebhookSpec {
        let events: Vec<Value> = events.into_iter().map(|event| Value::String(event.into())).collect();
        let mut body = Map::new();
        body.insert("url".into(), Value::String(url.into()));
        body.insert("events".into(), Value::Array(events));
        body.insert("secret".into(), Value::String(secret.into()));
        WebhookSpec { body }
    }

    /// Only events of these queues.
    pub fn queues<I: IntoIterator<Item = S>, S: Into<String>>(self, queues: I) -> WebhookSpec {
        self.filter("queues", queues)
    }

    /// Only events of these job types (exact or `prefix.*`).
    pub fn job_types<I: IntoIterator<Item = S>, S: Into<String>>(self, types: I) -> WebhookSpec {
        self.filter("job_types", types)
    }

    fn filter<I: IntoIterator<Item = S>, S: Into<String>>(mut self, key: &str, values: I) -> WebhookSpec {
        let values: Vec<Value> = values.into_iter().map(|value| Value::String(value.into())).collect();
        let filter = self.body.entry("filter").or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(filter) = filter {
            filter.insert(key.into(), Value::Array(values));
        }
        self
    }

    /// Kept and shown with the subscription.
    pub fn metadata(mut self, metadata: Map<String, Value>) -> WebhookSpec {
        self.body.insert("metadata".into(), Value::Object(metadata));
        self
    }

    pub fn active(mut self, active: bool) -> WebhookSpec {
        self.body.insert("active".into(), Value::Bool(active));
        self
    }
}

#[derive(Deserialize)]
struct SubscriptionBody {
    subscription: Subscription,
}

/// Webhook subscriptions: [`Client::webhooks`].
pub struct Webhooks<'a> {
    client: &'a Client,
}

impl Webhooks<'_> {
    /// Subscribes (`POST /webhooks`). Not retried after an unclear failure:
    /// a second create makes a second subscription.
    pub async fn create(&self, spec: WebhookSpec) -> Result<Subscription> {
        Ok(self.client.call::<SubscriptionBody>(Call::post("/webhooks").json(&spec.body)?).await?.subscription)
    }

    pub async fn get(&self, id: &str) -> Result<Subscription> {
        let call = Call::get(format!("/webhooks/{}", encode(id)));
        Ok(self.client.call::<SubscriptionBody>(call).await?.subscription)
    }

    /// A page of subscriptions, in creation order.
    pub async fn list(&self, options: &ListOptions) -> Result<Page<Subscription>> {
        self.client.list("/webhooks", "subscriptions", options, Vec::new()).await
    }

    /// Changes fields (`url`, `events`, `active`, `filter`, `metadata`, `secret`).
    pub async fn update(&self, id: &str, patch: Value) -> Result<Subscription> {
        let call =
            Call::new(reqwest::Method::PATCH, format!("/webhooks/{}", encode(id))).json(&patch)?.idempotent(true);
        Ok(self.client.call::<SubscriptionBody>(call).await?.subscription)
    }

    pub async fn delete(&self, id: &str) -> Result<()> {
        self.client.send(Call::delete(format!("/webhooks/{}", encode(id)))).await.map(drop)
    }

    /// Starts a secret rotation: deliveries are signed with both secrets.
    pub async fn rotate_secret(&self, id: &str, secret: &str) -> Result<Subscription> {
        let call = Call::post(format!("/webhooks/{}/secrets", encode(id))).json(&json!({ "secret": secret }))?;
        Ok(self.client.call::<SubscriptionBody>(call).await?.subscription)
    }

    /// Ends a secret rotation: the new secret alone signs from now on.
    pub async fn end_rotation(&self, id: &str) -> Result<Subscription> {
        let call = Call::new(reqwest::Method::DELETE, format!("/webhooks/{}/secrets/previous", encode(id)));
        Ok(self.client.call::<SubscriptionBody>(call).await?.subscription)
    }

    /// Sends a signed test event now and reports what the receiver said.
    pub async fn test(&self, id: &str) -> Result<WebhookTestResult> {
        self.client.call(Call::post(format!("/webhooks/{}/test", encode(id)))).await
    }
}

#[derive(Deserialize)]
struct WorkerBody {
    worker: WorkerInfo,
}

/// The worker registry: [`Client::workers`].
pub struct Workers<'a> {
    client: &'a Client,
}

impl Workers<'_> {
    /// A page of workers, by id.
    pub async fn list(&self, options: &ListOptions) -> Result<Page<WorkerInfo>> {
        self.client.list("/workers", "workers", options, Vec::new()).await
    }

    pub async fn get(&self, id: &str) -> Result<WorkerInfo> {
        Ok(self.client.call::<WorkerBody>(Call::get(format!("/workers/{}", encode(id)))).await?.worker)
    }

    /// Tells a worker to finish what it holds and take nothing new.
    pub async fn quiet(&self, id: &str) -> Result<WorkerInfo> {
        let call = Call::post(format!("/workers/{}/quiet", encode(id))).idempotent(true);
        Ok(self.client.call::<WorkerBody>(call).await?.worker)
    }

    /// Tells a worker to stop: it releases the jobs it holds.
    pub async fn terminate(&self, id: &str) -> Result<WorkerInfo> {
        let call = Call::post(format!("/workers/{}/terminate", encode(id))).idempotent(true);
        Ok(self.client.call::<WorkerBody>(call).await?.worker)
    }

    /// Forgets a worker and its signal; its jobs stay.
    pub async fn forget(&self, id: &str) -> Result<()> {
        self.client.send(Call::delete(format!("/workers/{}", encode(id)))).await.map(drop)
    }
}

/// Registered JSON Schemas: [`Client::schemas`].
pub struct Schemas<'a> {
    client: &'a Client,
}

impl Schemas<'_> {
    /// Registers a draft 2020-12 `schema` under the absolute `uri`.
    pub async fn register(&self, uri: &str, schema: Value) -> Result<Value> {
        let call = Call::post("/schemas").json(&json!({"uri": uri, "schema": schema}))?;
        self.client.call(call).await
    }

    /// A schema with its document.
    pub async fn get(&self, uri: &str) -> Result<Value> {
        self.client.call(Call::get(format!("/schemas/{}", encode(uri)))).await
    }

    pub async fn delete(&self, uri: &str) -> Result<()> {
        self.client.send(Call::delete(format!("/schemas/{}", encode(uri)))).await.map(drop)
    }
}
