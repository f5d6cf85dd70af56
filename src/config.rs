//! One `Config` with defaults, overridden in turn by a TOML file, environment
//! variables and command-line flags; validated before anything starts.
//!
//! | setting | flag | environment | file key | default |
//! |---|---|---|---|---|
//! | listen address | `--listen` | `SVC_LISTEN` | `listen` | `127.0.0.1:8080` |
//! | data dir | `--data-dir` | `SVC_DATA_DIR` | `data_dir` | `./data` |
//! | PostgreSQL instead of the data dir (a preview: docs/postgres.md) | `--postgres` | `SVC_POSTGRES_URL` | `postgres.url` | none |
//! | config file | `--config` | `SVC_CONFIG` | — | none |
//! | log bytes between snapshots | `--snapshot-log-bytes` | `SVC_SNAPSHOT_LOG_BYTES` | `storage.snapshot_log_bytes` | 256 MiB |
//! | direct (`O_DIRECT`) log writes where possible | — | `SVC_DIRECT_WRITES=0` turns off | `storage.direct_writes` | true |
//! | bind beyond loopback without auth | `--insecure-no-auth` | `SVC_INSECURE_NO_AUTH=1` | `insecure_no_auth` | false |
//!
//! The file may also set `http.request_timeout_ms`, `http.max_connections`,
//! `http.max_connections_per_address`, `limits.max_live_bytes`,
//! `http.allowed_origins` (origins such as `https://admin.example.com` whose
//! pages a server without keys serves), `jobs.default_timeout_ms`,
//! `jobs.default_visibility_timeout_ms`, `jobs.default_retry` (a retry policy
//! table), `retention.{completed,cancelled,discarded,dead_letter}` and
//! `shutdown.grace_period` (ISO 8601 durations), `retention.max_terminal_jobs`
//! and `retention.max_terminal_bytes` (integers, at least 1), `retention.workflows`
//! (duration), `retention.max_terminal_workflows` and
//! `retention.max_terminal_workflow_bytes` (integers, at least 1), `limits.max_cron`,
//! `rate_limit.requests` with `rate_limit.window_s` (the request rate limit
//! per client; off unless both are set), and `[[auth.keys]]` entries (`name`,
//! `role`, and one of `key`, `key_env`, `key_sha256`; no two with the same
//! key, and no digest of a well-known weak key); with keys, any address
//! may be bound; `auth.failed_attempts_per_minute` (wrong keys after which
//! an address gets 429 for the rest of the minute, 10; 0 turns the limit
//! off); `metrics.public` (bool) serves `/metrics` without a key;
//! `webhooks.allow_private_targets` (bool) lets webhooks go to loopback and
//! private addresses, `webhooks.extra_ca_file` (PEM) adds trusted CAs and pins self-signed receivers,
//! `webhooks.timeout_s`, `webhooks.priority` (`"normal"`, `"low"` or `"idle"`),
//! `webhooks.max_pending`, `webhooks.max_pending_bytes`, `webhooks.max_outbox`,
//! `webhooks.max_outbox_bytes`, `webhooks.concurrency`,
//! `webhooks.concurrency_per_subscription`, `webhooks.rotation_grace`
//! (duration), `limits.max_webhooks` and `limits.max_schemas`;
//! `postgres.pool_size` (connections per node, at least 1) and
//! `postgres.statement_timeout` (an ISO 8601 duration).

use clap::Parser;
use serde::Deserialize;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use crate::engine::Retention;
use crate::http::auth::{ApiKey, Role};
use crate::job::time::parse_duration_ms;
use crate::job::{JobDefaults, RetryPolicy};
use crate::limits::{CONNECTIONS_MAX_DEFAULT, REQUEST_TIMEOUT_MS, SNAPSHOT_LOG_BYTES_DEFAULT, TIMEOUT_MS_MAX};

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub listen: String,
    pub data_dir: PathBuf,
    pub snapshot_log_bytes: u64,
    /// Log frames bypass the page cache where the file system allows it.
    pub direct_writes: bool,
    pub request_timeout_ms: u64,
    /// Connections served at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// Connections one client address may hold at once; more are answered 503.
    pub max_connections_per_address: usize,
    /// Bytes the live (not yet ended) jobs may hold; past it new work gets 503.
    pub max_live_bytes: u64,
    /// The request rate limit per client: (requests, window in seconds); off when `None`.
    pub rate_limit: Option<(u64, u64)>,
    pub insecure_no_auth: bool,
    /// API keys (`[[auth.keys]]`); none: authentication is off.
    pub api_keys: Vec<ApiKey>,
    /// Wrong keys one client address may send a minute before it is
    /// answered 429 (`auth.failed_attempts_per_minute`); 0: no limit.
    pub auth_failed_attempts_per_minute: u64,
    /// `GET /metrics` needs no key (`metrics.public`).
    pub metrics_public: bool,
    /// Put before every dashboard link (`ui.prefix`): the path a reverse
    /// proxy serves svc under, such as `/svc`; empty when served at the root.
    pub ui_prefix: String,
    /// The PostgreSQL backend's settings, when svc runs on PostgreSQL
    /// instead of its data dir.
    pub postgres: Option<crate::backend::postgres::PgSettings>,
    /// Without keys, the origins whose web pages may send requests
    /// (`http.allowed_origins`), as `scheme://host[:port]`.
    pub http_allowed_origins: Vec<String>,
    /// How long a graceful shutdown waits for active jobs.
    pub shutdown_grace_ms: u64,
    pub jobs: JobDefaults,
    pub retention: Retention,
    /// Most cron entries the server holds.
    pub cron_entries_max: usize,
    /// Webhooks may be delivered to loopback and private addresses
    /// (`webhooks.allow_private_targets`).
    pub webhooks_allow_private_targets: bool,
    /// Extra CA certificates (PEM) webhook receivers are trusted by
    /// (`webhooks.extra_ca_file`).
    pub webhooks_extra_ca_file: Option<PathBuf>,
    /// How long one delivery attempt may take (`webhooks.timeout_s`, 1 to 60).
    pub webhooks_timeout_ms: u64,
    /// How the delivery thread shares the CPU (`webhooks.priority`).
    pub webhooks_priority: crate::webhook::DeliveryPriority,
    /// `limits.max_webhooks`, `webhooks.max_pending`, `webhooks.concurrency`,
    /// `webhooks.concurrency_per_subscription`, `webhooks.rotation_grace`.
    pub webhook_limits: crate::engine::outbox::WebhookLimits,
    /// Most registered schemas (`limits.max_schemas`).
    pub max_schemas: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".to_string(),
            data_dir: PathBuf::from("./data"),
            snapshot_log_bytes: SNAPSHOT_LOG_BYTES_DEFAULT,
            direct_writes: true,
            request_timeout_ms: REQUEST_TIMEOUT_MS,
            max_connections: CONNECTIONS_MAX_DEFAULT,
            max_connections_per_address: crate::limits::CONNECTIONS_PER_ADDRESS_MAX_DEFAULT,
            max_live_bytes: crate::limits::LIVE_BYTES_MAX_DEFAULT,
            rate_limit: None,
            insecure_no_auth: false,
            api_keys: Vec::new(),
            auth_failed_attempts_per_minute: crate::http::auth::FAILED_ATTEMPTS_PER_MINUTE,
            metrics_public: false,
            ui_prefix: String::new(),
            postgres: None,
            http_allowed_origins: Vec::new(),
            shutdown_grace_ms: 30_000,
            jobs: JobDefaults::default(),
            retention: Retention::default(),
            cron_entries_max: crate::limits::CRON_ENTRIES_MAX_DEFAULT,
            webhooks_allow_private_targets: false,
            webhooks_extra_ca_file: None,
            webhooks_timeout_ms: 30_000,
            webhooks_priority: crate::webhook::DeliveryPriority::default(),
            webhook_limits: crate::engine::outbox::WebhookLimits::default(),
            max_schemas: crate::limits::SCHEMAS_MAX,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    data_dir: Option<PathBuf>,
    insecure_no_auth: Option<bool>,
    storage: Option<StorageSection>,
    http: Option<HttpSection>,
    jobs: Option<JobsSection>,
    retention: Option<RetentionSection>,
    rate_limit: Option<RateLimitSection>,
    shutdown: Option<ShutdownSection>,
    limits: Option<LimitsSection>,
    auth: Option<AuthSection>,
    metrics: Option<MetricsSection>,
    webhooks: Option<WebhooksSection>,
    ui: Option<UiSection>,
    postgres: Option<PostgresSection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PostgresSection {
    url: Option<String>,
    pool_size: Option<usize>,
    statement_timeout: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct UiSection {
    prefix: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MetricsSection {
    public: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhooksSection {
    allow_private_targets: Option<bool>,
    extra_ca_file: Option<PathBuf>,
    timeout_s: Option<u64>,
    priority: Option<crate::webhook::DeliveryPriority>,
    max_pending: Option<usize>,
    max_pending_bytes: Option<usize>,
    max_outbox: Option<usize>,
    max_outbox_bytes: Option<usize>,
    concurrency: Option<usize>,
    concurrency_per_subscription: Option<usize>,
    rotation_grace: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthSection {
    #[serde(default)]
    keys: Vec<KeyEntry>,
    failed_attempts_per_minute: Option<u64>,
}

/// One `[[auth.keys]]` entry: a name, a role, and the key as text, as the
/// name of an environment variable holding it, or as its SHA-256.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    name: String,
    role: String,
    key: Option<String>,
    key_env: Option<String>,
    key_sha256: Option<String>,
}

impl std::fmt::Debug for KeyEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyEntry").field("name", &self.name).field("role", &self.role).finish_non_exhaustive()
    }
}

impl KeyEntry {
    fn resolve(self, env: &HashMap<String, String>) -> Result<ApiKey, String> {
        let KeyEntry { name, role, key, key_env, key_sha256 } = self;
        if name.is_empty() {
            return Err("auth.keys: every key needs a name".to_string());
        }
        let role = Role::parse(&role)
            .ok_or_else(|| format!("auth.keys {name}: role {role:?} is not admin, producer, worker or viewer"))?;
        match (key, key_env, key_sha256) {
            (Some(key), None, None) => ApiKey::from_key(name, role, &key),
            (None, Some(variable), None) => {
                let key = env
                    .get(&variable)
                    .ok_or_else(|| format!("auth.keys {name}: environment variable {variable} is not set"))?;
                ApiKey::from_key(name, role, key)
            }
            (None, None, Some(hex)) => ApiKey::from_sha256(name, role, &hex),
            _ => Err(format!("auth.keys {name}: give exactly one of key, key_env, key_sha256")),
        }
        .map_err(|error| format!("auth.keys: {error}"))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsSection {
    max_cron: Option<usize>,
    max_webhooks: Option<usize>,
    max_schemas: Option<usize>,
    max_live_bytes: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShutdownSection {
    grace_period: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StorageSection {
    snapshot_log_bytes: Option<u64>,
    direct_writes: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpSection {
    request_timeout_ms: Option<u64>,
    max_connections: Option<usize>,
    max_connections_per_address: Option<usize>,
    allowed_origins: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobsSection {
    default_timeout_ms: Option<u64>,
    default_visibility_timeout_ms: Option<u64>,
    default_retry: Option<toml::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitSection {
    requests: u64,
    window_s: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetentionSection {
    completed: Option<String>,
    cancelled: Option<String>,
    discarded: Option<String>,
    dead_letter: Option<String>,
    max_terminal_jobs: Option<u64>,
    max_terminal_bytes: Option<u64>,
    workflows: Option<String>,
    max_terminal_workflows: Option<u64>,
    max_terminal_workflow_bytes: Option<u64>,
}

impl Config {
    /// Builds the configuration from flags (`args`, without the subcommand) and
    /// environment variables (`env`), reading the config file they name.
    pub fn load(args: &[String], env: &HashMap<String, String>) -> Result<Config, String> {
        let command = std::iter::once("serve".to_string()).chain(args.iter().cloned());
        let flags = ServeFlags::try_parse_from(command).map_err(|error| error.to_string())?;
        Self::from_flags(&flags, env)
    }

    /// The one place settings are merged: defaults, then the file, then
    /// environment variables, then flags.
    pub fn from_flags(flags: &ServeFlags, env: &HashMap<String, String>) -> Result<Config, String> {
        let flags = flags.as_map();
        let setting = |flag: &str, variable: &str| flags.get(flag).cloned().or_else(|| env.get(variable).cloned());
        let mut config = Config::default();
        if let Some(path) = setting("config", "SVC_CONFIG") {
            let text =
                std::fs::read_to_string(&path).map_err(|error| format!("cannot read config file {path}: {error}"))?;
            let file: FileConfig = toml::from_str(&text).map_err(|error| format!("config file {path}: {error}"))?;
            config.apply_file(file, env).map_err(|error| format!("config file {path}: {error}"))?;
        }
        if let Some(listen) = setting("listen", "SVC_LISTEN") {
            config.listen = listen;
        }
        if let Some(dir) = setting("data-dir", "SVC_DATA_DIR") {
            config.data_dir = PathBuf::from(dir);
        }
        if let Some(url) = setting("postgres", "SVC_POSTGRES_URL") {
            let settings = config.postgres.get_or_insert_with(|| crate::backend::postgres::PgSettings::new(""));
            settings.url = url;
        }
        if config.postgres.as_ref().is_some_and(|settings| settings.url.is_empty()) {
            return Err("postgres: a [postgres] section needs a url (or --postgres, or SVC_POSTGRES_URL)".into());
        }
        if let Some(bytes) = setting("snapshot-log-bytes", "SVC_SNAPSHOT_LOG_BYTES") {
            config.snapshot_log_bytes =
                bytes.parse().map_err(|_| format!("snapshot log bytes must be a whole number, not {bytes}"))?;
        }
        if let Some(value) = env.get("SVC_DIRECT_WRITES") {
            config.direct_writes = match value.as_str() {
                "1" | "true" => true,
                "0" | "false" => false,
                _ => return Err(format!("SVC_DIRECT_WRITES must be 1, 0, true or false, not {value}")),
            };
        }
        if flags.contains_key("insecure-no-auth")
            || env.get("SVC_INSECURE_NO_AUTH").is_some_and(|value| value == "1" || value == "true")
        {
            config.insecure_no_auth = true;
        }
        config.validate()?;
        Ok(config)
    }

    fn apply_file(&mut self, file: FileConfig, env: &HashMap<String, String>) -> Result<(), String> {
        if let Some(section) = file.postgres {
            let mut settings = crate::backend::postgres::PgSettings::new(section.url.unwrap_or_default());
            if let Some(size) = section.pool_size {
                if size == 0 {
                    return Err("postgres.pool_size must be at least 1".into());
                }
                settings.pool_size = size;
            }
            if let Some(text) = section.statement_timeout {
                let ms = parse_duration_ms(&text).ok().filter(|ms| *ms > 0).ok_or_else(|| {
                    format!("postgres.statement_timeout: {text:?} is not a positive ISO 8601 duration")
                })?;
                settings.statement_timeout = std::time::Duration::from_millis(ms as u64);
            }
            self.postgres = Some(settings);
        }
        if let Some(prefix) = file.ui.and_then(|ui| ui.prefix) {
            let plain = prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b"/-_.~".contains(&b));
            if !(prefix.is_empty()
                || (prefix.starts_with('/') && !prefix.ends_with('/') && !prefix.contains("//") && plain))
            {
                return Err(format!(
                    "ui.prefix: {prefix:?} must be empty or a path such as \"/svc\" (a leading /, no trailing /)"
                ));
            }
            self.ui_prefix = prefix;
        }
        if let Some(public) = file.metrics.and_then(|metrics| metrics.public) {
            self.metrics_public = public;
        }
        if let Some(webhooks) = file.webhooks {
            if let Some(allow) = webhooks.allow_private_targets {
                self.webhooks_allow_private_targets = allow;
            }
            if let Some(path) = webhooks.extra_ca_file {
                self.webhooks_extra_ca_file = Some(path);
            }
            if let Some(seconds) = webhooks.timeout_s {
                if !(1..=60).contains(&seconds) {
                    return Err(format!("webhooks.timeout_s must be 1 to 60, not {seconds}"));
                }
                self.webhooks_timeout_ms = seconds * 1000;
            }
            if let Some(priority) = webhooks.priority {
                self.webhooks_priority = priority;
            }
            let limits = &mut self.webhook_limits;
            for (key, value, slot) in [
                ("max_pending", webhooks.max_pending, &mut limits.max_pending),
                ("max_pending_bytes", webhooks.max_pending_bytes, &mut limits.max_pending_bytes),
                ("max_outbox", webhooks.max_outbox, &mut limits.max_outbox),
                ("max_outbox_bytes", webhooks.max_outbox_bytes, &mut limits.max_outbox_bytes),
                ("concurrency", webhooks.concurrency, &mut limits.concurrency),
                (
                    "concurrency_per_subscription",
                    webhooks.concurrency_per_subscription,
                    &mut limits.concurrency_per_subscription,
                ),
            ] {
                match value {
                    Some(0) => return Err(format!("webhooks.{key} must be at least 1")),
                    Some(value) => *slot = value,
                    None => {}
                }
            }
            if let Some(grace) = webhooks.rotation_grace {
                limits.rotation_grace_ms =
                    parse_duration_ms(&grace).map_err(|message| format!("webhooks.rotation_grace: {message}"))?;
            }
        }
        if let Some(auth) = file.auth {
            self.api_keys = auth.keys.into_iter().map(|entry| entry.resolve(env)).collect::<Result<_, _>>()?;
            let mut names: Vec<&str> = self.api_keys.iter().map(|key| key.name.as_str()).collect();
            names.sort_unstable();
            if let Some(pair) = names.windows(2).find(|pair| pair[0] == pair[1]) {
                return Err(format!("auth.keys: the name {} is used twice", pair[0]));
            }
            // A key under two entries would act with whichever role comes first.
            for (index, key) in self.api_keys.iter().enumerate() {
                if let Some(other) = self.api_keys[index + 1..].iter().find(|other| other.digest == key.digest) {
                    return Err(format!(
                        "auth.keys: {} and {} have the same key; give each entry a key of its own",
                        key.name, other.name
                    ));
                }
            }
            if let Some(attempts) = auth.failed_attempts_per_minute {
                self.auth_failed_attempts_per_minute = attempts;
            }
        }
        if let Some(listen) = file.listen {
            self.listen = listen;
        }
        if let Some(dir) = file.data_dir {
            self.data_dir = dir;
        }
        if let Some(flag) = file.insecure_no_auth {
            self.insecure_no_auth = flag;
        }
        if let Some(storage) = file.storage {
            if let Some(bytes) = storage.snapshot_log_bytes {
                self.snapshot_log_bytes = bytes;
            }
            if let Some(direct) = storage.direct_writes {
                self.direct_writes = direct;
            }
        }
        if let Some(http) = file.http {
            if let Some(ms) = http.request_timeout_ms {
                self.request_timeout_ms = ms;
            }
            if let Some(max) = http.max_connections {
                self.max_connections = max;
            }
            if let Some(max) = http.max_connections_per_address {
                self.max_connections_per_address = max;
            }
            if let Some(origins) = http.allowed_origins {
                self.http_allowed_origins = origins
                    .iter()
                    .map(|text| {
                        crate::http::auth::origin_of(text).ok_or_else(|| {
                            format!(
                                "http.allowed_origins: {text:?} is not an origin \
                                 (scheme://host[:port], http or https, no path)"
                            )
                        })
                    })
                    .collect::<Result<_, _>>()?;
            }
        }
        if let Some(jobs) = file.jobs {
            if let Some(ms) = jobs.default_timeout_ms {
                self.jobs.timeout_ms = ms;
            }
            if let Some(ms) = jobs.default_visibility_timeout_ms {
                self.jobs.visibility_timeout_ms = ms;
            }
            if let Some(policy) = jobs.default_retry {
                let value = serde_json::to_value(policy).map_err(|error| error.to_string())?;
                self.jobs.retry = RetryPolicy::merged_value(&RetryPolicy::default(), &value, "jobs.default_retry")
                    .map(std::sync::Arc::new)
                    .map_err(|error| error.message)?;
            }
        }
        if let Some(limits) = file.limits {
            if let Some(max) = limits.max_cron {
                self.cron_entries_max = max;
            }
            if let Some(max) = limits.max_webhooks {
                self.webhook_limits.max_webhooks = max;
            }
            if let Some(max) = limits.max_schemas {
                self.max_schemas = max;
            }
            if let Some(max) = limits.max_live_bytes {
                self.max_live_bytes = max;
            }
        }
        if let Some(grace) = file.shutdown.and_then(|shutdown| shutdown.grace_period) {
            self.shutdown_grace_ms =
                parse_duration_ms(&grace).map_err(|message| format!("shutdown.grace_period: {message}"))? as u64;
        }
        if let Some(limit) = file.rate_limit {
            if limit.requests == 0 || limit.window_s == 0 {
                return Err("rate_limit.requests and rate_limit.window_s must be at least 1".to_string());
            }
            self.rate_limit = Some((limit.requests, limit.window_s));
        }
        if let Some(retention) = file.retention {
            let duration = |text: Option<String>, current: i64, key: &str| -> Result<i64, String> {
                text.map_or(Ok(current), |text| {
                    parse_duration_ms(&text).map_err(|message| format!("retention.{key}: {message}"))
                })
            };
            self.retention.completed_ms = duration(retention.completed, self.retention.completed_ms, "completed")?;
            self.retention.cancelled_ms = duration(retention.cancelled, self.retention.cancelled_ms, "cancelled")?;
            self.retention.discarded_ms = duration(retention.discarded, self.retention.discarded_ms, "discarded")?;
            self.retention.dead_letter_ms =
                duration(retention.dead_letter, self.retention.dead_letter_ms, "dead_letter")?;
            if let Some(jobs) = retention.max_terminal_jobs {
                if jobs == 0 {
                    return Err("retention.max_terminal_jobs must be at least 1".to_string());
                }
                self.retention.max_terminal_jobs = usize::try_from(jobs).unwrap_or(usize::MAX);
            }
            if let Some(bytes) = retention.max_terminal_bytes {
                if bytes == 0 {
                    return Err("retention.max_terminal_bytes must be at least 1".to_string());
                }
                self.retention.max_terminal_bytes = bytes;
            }
            self.retention.workflows_ms = duration(retention.workflows, self.retention.workflows_ms, "workflows")?;
            if let Some(workflows) = retention.max_terminal_workflows {
                if workflows == 0 {
                    return Err("retention.max_terminal_workflows must be at least 1".to_string());
                }
                self.retention.max_terminal_workflows = usize::try_from(workflows).unwrap_or(usize::MAX);
            }
            if let Some(bytes) = retention.max_terminal_workflow_bytes {
                if bytes == 0 {
                    return Err("retention.max_terminal_workflow_bytes must be at least 1".to_string());
                }
                self.retention.max_terminal_workflow_bytes = bytes;
            }
        }
        Ok(())
    }

    /// Whether the listen address resolves to loopback addresses only.
    pub fn binds_loopback_only(&self) -> bool {
        self.listen.to_socket_addrs().is_ok_and(|mut addresses| addresses.all(|address| is_loopback(address.ip())))
    }

    fn validate(&self) -> Result<(), String> {
        let addresses: Vec<SocketAddr> = self
            .listen
            .to_socket_addrs()
            .map_err(|error| format!("listen address {} is not host:port ({error})", self.listen))?
            .collect();
        if addresses.is_empty() {
            return Err(format!("listen address {} resolves to nothing", self.listen));
        }
        let loopback = addresses.iter().all(|address| is_loopback(address.ip()));
        if !loopback && !self.insecure_no_auth && self.api_keys.is_empty() {
            return Err(format!(
                "refusing to listen on {} without authentication; bind a loopback address, or pass --insecure-no-auth behind a trusted proxy",
                self.listen
            ));
        }
        for (name, ms) in [
            ("jobs.default_timeout_ms", self.jobs.timeout_ms),
            ("jobs.default_visibility_timeout_ms", self.jobs.visibility_timeout_ms),
        ] {
            if !(1..=TIMEOUT_MS_MAX).contains(&ms) {
                return Err(format!("{name} must be from 1 to {TIMEOUT_MS_MAX}"));
            }
        }
        if self.request_timeout_ms == 0 {
            return Err("http.request_timeout_ms must be at least 1".to_string());
        }
        if self.max_connections_per_address == 0 {
            return Err("http.max_connections_per_address must be at least 1".to_string());
        }
        if self.max_live_bytes == 0 {
            return Err("limits.max_live_bytes must be at least 1".to_string());
        }
        if self.max_connections == 0 {
            return Err("http.max_connections must be at least 1".to_string());
        }
        if self.snapshot_log_bytes == 0 {
            return Err("storage.snapshot_log_bytes must be at least 1".to_string());
        }
        Ok(())
    }
}

fn is_loopback(ip: IpAddr) -> bool {
    ip.is_loopback()
}

/// `--name value`, `--name=value` and bare `--flag` (for `insecure-no-auth`).
/// The flags of `svc serve`.
#[derive(Debug, Clone, Default, clap::Parser)]
#[command(name = "serve", about = "Run the server in the foreground until SIGTERM or SIGINT")]
pub struct ServeFlags {
    /// Address to listen on [env: SVC_LISTEN] [default: 127.0.0.1:8080]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Where the log and snapshots live [env: SVC_DATA_DIR] [default: ./data]
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<String>,
    /// Run on PostgreSQL instead of the data dir, a preview (docs/postgres.md) [env: SVC_POSTGRES_URL]
    #[arg(long, value_name = "URL")]
    pub postgres: Option<String>,
    /// A TOML settings file (see data/svc.example.toml) [env: SVC_CONFIG]
    #[arg(long, value_name = "FILE")]
    pub config: Option<String>,
    /// Log bytes written between snapshots [env: SVC_SNAPSHOT_LOG_BYTES] [default: 256 MiB]
    #[arg(long, value_name = "BYTES")]
    pub snapshot_log_bytes: Option<String>,
    /// Listen beyond loopback without API keys (behind a proxy that authenticates) [env: SVC_INSECURE_NO_AUTH=1]
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// How log lines look on standard error
    #[arg(long, value_enum, default_value = "human")]
    pub log_format: crate::logging::LogFormat,
    /// The least severe log lines written: error, warn, info, debug (a line per request) or trace
    #[arg(long, value_enum, default_value = "info")]
    pub log_level: crate::logging::LogLevel,
}

impl ServeFlags {
    /// The flags given, by name.
    fn as_map(&self) -> HashMap<String, String> {
        let mut flags = HashMap::new();
        let given = [
            ("listen", &self.listen),
            ("data-dir", &self.data_dir),
            ("postgres", &self.postgres),
            ("config", &self.config),
            ("snapshot-log-bytes", &self.snapshot_log_bytes),
        ];
        for (name, value) in given {
            if let Some(value) = value {
                flags.insert(name.to_string(), value.clone());
            }
        }
        if self.insecure_no_auth {
            flags.insert("insecure-no-auth".to_string(), "true".to_string());
        }
        flags
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webhook::DeliveryPriority;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|arg| arg.to_string()).collect()
    }

    #[test]
    fn flags_beat_environment_beat_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("svc.toml");
        std::fs::write(
            &file,
            "listen = \"127.0.0.1:7000\"\ndata_dir = \"/from/file\"\n[jobs]\ndefault_retry = { max_attempts = 9 }\n",
        )
        .unwrap();
        let env = HashMap::from([
            ("SVC_CONFIG".to_string(), file.display().to_string()),
            ("SVC_DATA_DIR".to_string(), "/from/env".to_string()),
        ]);
        let config = Config::load(&args(&["--listen", "127.0.0.1:9000"]), &env).unwrap();
        assert_eq!(config.listen, "127.0.0.1:9000");
        assert_eq!(config.data_dir, PathBuf::from("/from/env"));
        assert_eq!(config.jobs.retry.max_attempts, 9);
    }

    #[test]
    fn webhook_settings_come_from_the_file_and_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("svc.toml");
        let env = HashMap::from([("SVC_CONFIG".to_string(), file.display().to_string())]);
        let defaults = Config::load(&[], &HashMap::new()).unwrap();
        assert!(!defaults.webhooks_allow_private_targets && defaults.webhooks_extra_ca_file.is_none());
        assert_eq!(defaults.webhooks_timeout_ms, 30_000);
        assert_eq!(defaults.webhooks_priority, DeliveryPriority::Normal);
        let text = "[webhooks]\nallow_private_targets = true\nextra_ca_file = \"/ca.pem\"\ntimeout_s = 5\npriority = \"idle\"\n\
                    max_pending = 10\nconcurrency = 4\nconcurrency_per_subscription = 2\nrotation_grace = \"PT1H\"\n\
                    max_pending_bytes = 1000\nmax_outbox = 20\nmax_outbox_bytes = 5000\n\
                    [limits]\nmax_webhooks = 3\nmax_schemas = 7\nmax_live_bytes = 123456\n";
        std::fs::write(&file, text).unwrap();
        let config = Config::load(&[], &env).unwrap();
        let limits = config.webhook_limits;
        assert_eq!((limits.max_pending, limits.concurrency, limits.concurrency_per_subscription), (10, 4, 2));
        assert_eq!((limits.rotation_grace_ms, limits.max_webhooks, config.max_schemas), (3_600_000, 3, 7));
        assert!(config.webhooks_allow_private_targets);
        assert_eq!(config.webhooks_extra_ca_file, Some(PathBuf::from("/ca.pem")));
        assert_eq!(config.webhooks_timeout_ms, 5_000);
        assert_eq!(config.webhooks_priority, DeliveryPriority::Idle);
        assert_eq!((limits.max_pending_bytes, limits.max_outbox, limits.max_outbox_bytes), (1000, 20, 5000));
        assert_eq!(config.max_live_bytes, 123_456);
        std::fs::write(&file, "[webhooks]\npriority = \"low\"\n").unwrap();
        assert_eq!(Config::load(&[], &env).unwrap().webhooks_priority, DeliveryPriority::Low);
        for bad in [
            "[webhooks]\nmax_outbox_bytes = 0\n",
            "[limits]\nmax_live_bytes = 0\n",
            "[webhooks]\npriority = \"high\"\n",
            "[webhooks]\ntimeout_s = 0\n",
            "[webhooks]\ntimeout_s = 61\n",
            "[webhooks]\nunknown = 1\n",
            "[webhooks]\nconcurrency = 0\n",
            "[webhooks]\nrotation_grace = \"soon\"\n",
        ] {
            std::fs::write(&file, bad).unwrap();
            assert!(Config::load(&[], &env).is_err(), "{bad}");
        }
    }

    #[test]
    fn direct_writes_can_be_turned_off_by_file_or_environment() {
        let none = HashMap::new();
        assert!(Config::load(&[], &none).unwrap().direct_writes, "on by default");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("svc.toml");
        std::fs::write(&file, "[storage]\ndirect_writes = false\n").unwrap();
        let with_file = HashMap::from([("SVC_CONFIG".to_string(), file.display().to_string())]);
        assert!(!Config::load(&[], &with_file).unwrap().direct_writes);
        let mut env = with_file.clone();
        env.insert("SVC_DIRECT_WRITES".into(), "1".into());
        assert!(Config::load(&[], &env).unwrap().direct_writes, "the environment beats the file");
        env.insert("SVC_DIRECT_WRITES".into(), "0".into());
        assert!(!Config::load(&[], &env).unwrap().direct_writes);
        env.insert("SVC_DIRECT_WRITES".into(), "no".into());
        assert!(Config::load(&[], &env).unwrap_err().contains("SVC_DIRECT_WRITES"));
    }

    #[test]
    fn terminal_job_caps_come_from_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("svc.toml");
        let load = |text: &str| {
            std::fs::write(&file, text).unwrap();
            Config::load(&[], &HashMap::from([("SVC_CONFIG".to_string(), file.display().to_string())]))
        };
        let defaults = Config::load(&[], &HashMap::new()).unwrap().retention;
        assert_eq!((defaults.max_terminal_jobs, defaults.max_terminal_bytes), (1_000_000, 256 * 1024 * 1024));
        let config = load("[retention]\nmax_terminal_jobs = 50\nmax_terminal_bytes = 4096\n").unwrap();
        assert_eq!((config.retention.max_terminal_jobs, config.retention.max_terminal_bytes), (50, 4096));
        assert!(load("[retention]\nmax_terminal_jobs = 0\n").unwrap_err().contains("max_terminal_jobs"));
        assert!(load("[retention]\nmax_terminal_bytes = -1\n").is_err());
    }

    #[test]
    fn the_request_rate_limit_is_off_unless_configured() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("svc.toml");
        let load = |text: &str| {
            std::fs::write(&file, text).unwrap();
            Config::load(&[], &HashMap::from([("SVC_CONFIG".to_string(), file.display().to_string())]))
        };
        assert_eq!(Config::load(&[], &HashMap::new()).unwrap().rate_limit, None);
        assert_eq!(load("[rate_limit]\nrequests = 1000\nwindow_s = 1\n").unwrap().rate_limit, Some((1000, 1)));
        assert!(load("[rate_limit]\nrequests = 0\nwindow_s = 1\n").is_err());
        assert!(load("[rate_limit]\nrequests = 10\n").is_err(), "both are needed");
    }

    #[test]
    fn wrong_keys_are_limited_unless_the_file_turns_it_off() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("svc.toml");
        let load = |text: &str| {
            std::fs::write(&file, text).unwrap();
            Config::load(&[], &HashMap::from([("SVC_CONFIG".to_string(), file.display().to_string())]))
        };
        assert_eq!(Config::load(&[], &HashMap::new()).unwrap().auth_failed_attempts_per_minute, 10);
        assert_eq!(load("[auth]\nfailed_attempts_per_minute = 3\n").unwrap().auth_failed_attempts_per_minute, 3);
        assert_eq!(load("[auth]\nfailed_attempts_per_minute = 0\n").unwrap().auth_failed_attempts_per_minute, 0);
        assert!(load("[auth]\nfailed_attempts_per_minute = -1\n").is_err());
    }

    #[test]
    fn allowed_origins_are_read_as_browsers_send_them_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("svc.toml");
        let load = |text: &str| {
            std::fs::write(&file, text).unwrap();
            Config::load(&[], &HashMap::from([("SVC_CONFIG".to_string(), file.display().to_string())]))
        };
        assert!(Config::load(&[], &HashMap::new()).unwrap().http_allowed_origins.is_empty());
        let config =
            load("[http]\nallowed_origins = [\"https://Admin.Example.com\", \"http://localhost:3000/\", \"https://x.example:443\"]\n")
                .unwrap();
        assert_eq!(
            config.http_allowed_origins,
            ["https://admin.example.com", "http://localhost:3000", "https://x.example"]
        );
        for bad in
            ["\"https://admin.example.com/app\"", "\"*\"", "\"null\"", "\"admin.example.com\"", "\"ftp://a.example\""]
        {
            let error = load(&format!("[http]\nallowed_origins = [{bad}]\n")).unwrap_err();
            assert!(error.contains("http.allowed_origins"), "{bad}: {error}");
        }
    }

    #[test]
    fn non_loopback_needs_the_insecure_flag() {
        let env = HashMap::new();
        assert!(
            Config::load(&args(&["--listen", "0.0.0.0:8080"]), &env).unwrap_err().contains("without authentication")
        );
        assert!(Config::load(&args(&["--listen", "0.0.0.0:8080", "--insecure-no-auth"]), &env).is_ok());
    }

    #[test]
    fn the_shipped_example_config_is_valid() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/svc.example.toml");
        let env = HashMap::from([("SVC_CONFIG".to_string(), path.to_string())]);
        let config = Config::load(&[], &env).unwrap();
        assert_eq!((config.retention.dead_letter_ms, config.jobs.retry.max_attempts), (30 * 86_400_000, 3));
    }

    #[test]
    fn postgres_settings_come_from_the_file_the_environment_and_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("svc.toml");
        let with_file = |text: &str| {
            std::fs::write(&file, text).unwrap();
            HashMap::from([("SVC_CONFIG".to_string(), file.display().to_string())])
        };
        assert_eq!(Config::load(&[], &HashMap::new()).unwrap().postgres, None, "the data dir by default");
        let env = with_file("[postgres]\nurl = \"postgres://db/svc\"\npool_size = 3\nstatement_timeout = \"PT5S\"\n");
        let settings = Config::load(&[], &env).unwrap().postgres.unwrap();
        assert_eq!(settings.url, "postgres://db/svc");
        assert_eq!((settings.pool_size, settings.statement_timeout), (3, std::time::Duration::from_secs(5)));
        // The environment, then the flag, take the URL over; the rest stays.
        let mut env = env;
        env.insert("SVC_POSTGRES_URL".into(), "postgres://env/svc".into());
        assert_eq!(Config::load(&[], &env).unwrap().postgres.unwrap().url, "postgres://env/svc");
        let flagged = Config::load(&args(&["--postgres", "postgres://flag/svc"]), &env).unwrap().postgres.unwrap();
        assert_eq!((flagged.url.as_str(), flagged.pool_size), ("postgres://flag/svc", 3));
        for (text, complaint) in [
            ("[postgres]\npool_size = 2\n", "needs a url"),
            ("[postgres]\nurl = \"postgres://db/svc\"\npool_size = 0\n", "pool_size"),
            ("[postgres]\nurl = \"postgres://db/svc\"\nstatement_timeout = \"soon\"\n", "statement_timeout"),
        ] {
            let error = Config::load(&[], &with_file(text)).unwrap_err();
            assert!(error.contains(complaint), "{error}");
        }
    }

    #[test]
    fn the_dashboard_prefix_is_a_path_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("svc.toml");
        let load = |prefix: &str| {
            std::fs::write(&file, format!("[ui]\nprefix = {prefix:?}\n")).unwrap();
            let env = HashMap::from([("SVC_CONFIG".to_string(), file.display().to_string())]);
            Config::load(&[], &env).map(|config| config.ui_prefix)
        };
        assert_eq!(load("/svc").unwrap(), "/svc");
        assert_eq!(load("").unwrap(), "");
        for bad in ["svc", "/svc/", "//evil.example", "/a b", "/x\"<"] {
            assert!(load(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn unknown_settings_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("svc.toml");
        std::fs::write(&file, "lisen = \"x\"\n").unwrap();
        let env = HashMap::from([("SVC_CONFIG".to_string(), file.display().to_string())]);
        assert!(Config::load(&[], &env).is_err());
        assert!(Config::load(&args(&["--bogus"]), &HashMap::new()).is_err());
    }
}
