//! The cron endpoints (docs/api.md, "The other cron routes") and the cron object.

use hyper::{Method, StatusCode};
use serde_json::{Value, json};

use super::auth::Role;
use super::error::ApiError;
use super::paging::{decode_cursor, encode_cursor, page_limit, percent_decode, query_pairs, query_value};
use super::{AppState, Reply};
use crate::cron::{is_valid_cron_name, parse_cron_body, patch_cron_body};
use crate::engine::{CronEntry, EngineError};
use crate::job::time::format_timestamp;

/// The cron routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CronRoute {
    List,
    Register,
    Get(String),
    Patch(String),
    Delete(String),
}

impl CronRoute {
    /// What a path under `/svc/v1/cron` takes (`rest`: the segments after it).
    pub fn choices(rest: &[&str]) -> Vec<(Method, CronRoute)> {
        match rest {
            [] => vec![(Method::GET, CronRoute::List), (Method::POST, CronRoute::Register)],
            [name] if !name.is_empty() => {
                let name = percent_decode(name);
                vec![
                    (Method::GET, CronRoute::Get(name.clone())),
                    (Method::PATCH, CronRoute::Patch(name.clone())),
                    (Method::DELETE, CronRoute::Delete(name)),
                ]
            }
            _ => Vec::new(),
        }
    }

    /// The metrics number, method and template (as the router's templates).
    pub fn template(&self) -> (usize, &'static str, &'static str) {
        match self {
            CronRoute::List => (32, "GET", "/svc/v1/cron"),
            CronRoute::Register => (33, "POST", "/svc/v1/cron"),
            CronRoute::Get(_) => (34, "GET", "/svc/v1/cron/{name}"),
            CronRoute::Patch(_) => (35, "PATCH", "/svc/v1/cron/{name}"),
            CronRoute::Delete(_) => (36, "DELETE", "/svc/v1/cron/{name}"),
        }
    }

    /// Cron entries are the operator's.
    pub fn allows(&self, role: Role) -> bool {
        role == Role::Admin
    }

    pub async fn handle(self, app: &AppState, query: &str, body: &[u8]) -> Result<Reply, ApiError> {
        match self {
            CronRoute::List => list(app, query).await,
            CronRoute::Register => register(app, body).await,
            CronRoute::Get(name) => get(app, &name).await,
            CronRoute::Patch(name) => patch(app, &name, body).await,
            CronRoute::Delete(name) => delete(app, &name).await,
        }
    }

    #[cfg(test)]
    pub fn samples() -> Vec<CronRoute> {
        let name = || "x".to_string();
        vec![
            CronRoute::List,
            CronRoute::Register,
            CronRoute::Get(name()),
            CronRoute::Patch(name()),
            CronRoute::Delete(name()),
        ]
    }
}

/// How often a `PATCH` retries when the entry changed between read and write.
const PATCH_ATTEMPTS_MAX: usize = 3;

/// The cron object.
pub fn render_cron(entry: &CronEntry) -> Value {
    let definition = &entry.definition;
    let raw = |text: &str| serde_json::from_str::<Value>(text).unwrap_or(Value::Null);
    let mut cron = json!({
        "name": definition.name,
        "schedule": definition.schedule,
        "expression": definition.schedule,
        "timezone": definition.timezone,
        "type": definition.job.payload.job_type(),
        "args": raw(definition.job.payload.args()),
        "queue": definition.job.queue,
        "meta": raw(definition.job.payload.meta()),
        "options": raw(&definition.options),
        "overlap_policy": definition.overlap.as_str(),
        "enabled": definition.enabled,
        "status": if definition.enabled { "active" } else { "disabled" },
        "run_count": entry.run_count,
        "created_at": format_timestamp(entry.created_at),
        "updated_at": format_timestamp(entry.updated_at),
    });
    if let Some(at) = entry.next_run_at {
        cron["next_run_at"] = format_timestamp(at).into();
    }
    if let Some(description) = &definition.description {
        cron["description"] = description.clone().into();
    }
    if let Some(at) = entry.last_run_at {
        cron["last_run_at"] = format_timestamp(at).into();
    }
    if let Some(id) = entry.last_job_id {
        cron["last_job_id"] = id.to_string().into();
    }
    cron
}

fn cron_body(entry: &CronEntry) -> String {
    json!({"cron": render_cron(entry)}).to_string()
}

/// A path name that is not a valid cron name cannot exist: 404.
fn known_name(name: &str) -> Result<&str, ApiError> {
    if is_valid_cron_name(name) { Ok(name) } else { Err(ApiError::not_found("cron", name)) }
}

async fn register(app: &AppState, body: &[u8]) -> Result<Reply, ApiError> {
    let definition = parse_cron_body(body, &app.defaults)?;
    let (entry, created) = app.backend.cron_put(definition).outcome().await?;
    let reply = Reply::ok(cron_body(&entry));
    Ok(if created {
        reply
            .with_status(StatusCode::CREATED)
            .header(hyper::header::LOCATION, format!("/svc/v1/cron/{}", entry.definition.name))
    } else {
        reply
    })
}

async fn list(app: &AppState, query: &str) -> Result<Reply, ApiError> {
    let pairs = query_pairs(query);
    let limit = page_limit(&pairs)?;
    let enabled = match query_value(&pairs, "enabled").filter(|value| !value.is_empty()) {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(_) => return Err(ApiError::invalid_request(Some("enabled"), "enabled must be true or false")),
    };
    let after = query_value(&pairs, "cursor").filter(|cursor| !cursor.is_empty()).map(decode_cursor).transpose()?;
    let (page, has_more) = app.backend.crons_page(after, limit, enabled).outcome().await?;
    let cursor =
        if has_more { page.last().map(|entry| Value::from(encode_cursor(&entry.definition.name))) } else { None };
    let crons: Vec<Value> = page.iter().map(|entry| render_cron(entry)).collect();
    Ok(Reply::ok(json!({"crons": crons, "cursor": cursor, "has_more": has_more}).to_string()))
}

async fn get(app: &AppState, name: &str) -> Result<Reply, ApiError> {
    let entry = app
        .backend
        .cron(known_name(name)?.to_string())
        .outcome()
        .await?
        .ok_or_else(|| ApiError::not_found("cron", name))?;
    Ok(Reply::ok(cron_body(&entry)))
}

async fn patch(app: &AppState, name: &str, body: &[u8]) -> Result<Reply, ApiError> {
    let name = known_name(name)?;
    for _ in 0..PATCH_ATTEMPTS_MAX {
        let current =
            app.backend.cron(name.to_string()).outcome().await?.ok_or_else(|| ApiError::not_found("cron", name))?;
        let definition = patch_cron_body(&current.definition, body, &app.defaults)?;
        match app.backend.cron_patch(definition, current.revision).outcome().await {
            Ok((entry, _)) => return Ok(Reply::ok(cron_body(&entry))),
            // Changed meanwhile: apply the patch to the newer entry.
            Err(EngineError::CronChanged { .. }) => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Err(EngineError::CronChanged { name: name.to_string() }.into())
}

async fn delete(app: &AppState, name: &str) -> Result<Reply, ApiError> {
    let entry = app.backend.cron_delete(known_name(name)?.to_string()).outcome().await?;
    Ok(Reply::ok(json!({"cron": render_cron(&entry), "deleted": true}).to_string()))
}
