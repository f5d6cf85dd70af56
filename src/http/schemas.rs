//! The schema registry's endpoints (docs/api.md, "Schemas"): register, list,
//! read and delete JSON Schemas that jobs name in `schema`.

use hyper::{Method, StatusCode};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;

use super::auth::Role;
use super::error::ApiError;
use super::paging::{decode_cursor, encode_cursor, page_limit, percent_decode, query_pairs, query_value};
use super::{AppState, Reply};
use crate::job::time::format_timestamp;
use crate::schema::{SchemaEntry, parse_registration};

/// The schema routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaRoute {
    List,
    Register,
    Get(String),
    Delete(String),
}

impl SchemaRoute {
    /// What a path under `/svc/v1/schemas` takes (`rest`: the segments after
    /// it). A schema URI may hold `/` (`https://…`): the rest of the path is
    /// the URI.
    pub fn choices(rest: &[&str]) -> Vec<(Method, SchemaRoute)> {
        if rest.is_empty() {
            return vec![(Method::GET, SchemaRoute::List), (Method::POST, SchemaRoute::Register)];
        }
        if rest.concat().is_empty() {
            return Vec::new();
        }
        let uri = percent_decode(&rest.join("/"));
        vec![(Method::GET, SchemaRoute::Get(uri.clone())), (Method::DELETE, SchemaRoute::Delete(uri))]
    }

    /// The metrics number, method and template (as the router's templates).
    pub fn template(&self) -> (usize, &'static str, &'static str) {
        match self {
            SchemaRoute::List => (38, "GET", "/svc/v1/schemas"),
            SchemaRoute::Register => (39, "POST", "/svc/v1/schemas"),
            SchemaRoute::Get(_) => (40, "GET", "/svc/v1/schemas/{uri}"),
            SchemaRoute::Delete(_) => (41, "DELETE", "/svc/v1/schemas/{uri}"),
        }
    }

    /// The registry is the operator's.
    pub fn allows(&self, role: Role) -> bool {
        role == Role::Admin
    }

    pub async fn handle(self, app: &AppState, query: &str, body: &[u8]) -> Result<Reply, ApiError> {
        match self {
            SchemaRoute::List => list(app, query).await,
            SchemaRoute::Register => register(app, body).await,
            SchemaRoute::Get(uri) => get(app, &uri).await,
            SchemaRoute::Delete(uri) => delete(app, &uri).await,
        }
    }

    #[cfg(test)]
    pub fn samples() -> Vec<SchemaRoute> {
        let uri = || "x".to_string();
        vec![SchemaRoute::List, SchemaRoute::Register, SchemaRoute::Get(uri()), SchemaRoute::Delete(uri())]
    }
}

/// The schema object; the document itself only when `with_document`.
pub fn render_schema(entry: &SchemaEntry, with_document: bool) -> Value {
    let mut schema = json!({"uri": entry.uri, "created_at": format_timestamp(entry.created_at)});
    if let Some(job_type) = &entry.job_type {
        schema["type"] = job_type.clone().into();
    }
    if let Some(version) = &entry.version {
        schema["version"] = serde_json::from_str(version).unwrap_or(Value::Null);
    }
    if with_document {
        schema["schema"] = entry.document_value();
    }
    schema
}

/// A path that cannot be a schema URI names no schema: 404.
fn known_uri(uri: &str) -> Result<&str, ApiError> {
    match crate::schema::check_uri(uri) {
        Ok(()) => Ok(uri),
        Err(_) => Err(ApiError::not_found("schema", uri)),
    }
}

async fn register(app: &AppState, body: &[u8]) -> Result<Reply, ApiError> {
    let now = crate::clock::Clock::now_ms(app.clock.as_ref());
    // `$ref`s may name registered schemas: the registry is read first (it
    // is bounded by `schemas.max`, and registering is rare).
    let registered = all_schemas(app).await?;
    let registration = parse_registration(body, now, &|uri| registered.get(uri).cloned())?;
    let entry = app.backend.register_schema(registration).outcome().await?;
    let location = format!("/svc/v1/schemas/{}", encode_path_segment(&entry.uri));
    Ok(Reply::ok(json!({"schema": render_schema(&entry, false)}).to_string())
        .with_status(StatusCode::CREATED)
        .header(hyper::header::LOCATION, location))
}

async fn list(app: &AppState, query: &str) -> Result<Reply, ApiError> {
    let pairs = query_pairs(query);
    let limit = page_limit(&pairs)?;
    let after = query_value(&pairs, "cursor").filter(|cursor| !cursor.is_empty()).map(decode_cursor).transpose()?;
    let (page, has_more) = app.backend.schemas_page(after, limit).outcome().await?;
    let cursor = if has_more { page.last().map(|entry| Value::from(encode_cursor(&entry.uri))) } else { None };
    let schemas: Vec<Value> = page.iter().map(|entry| render_schema(entry, false)).collect();
    Ok(Reply::ok(json!({"schemas": schemas, "cursor": cursor, "has_more": has_more}).to_string()))
}

async fn get(app: &AppState, uri: &str) -> Result<Reply, ApiError> {
    let entry = app
        .backend
        .schema(known_uri(uri)?.to_string())
        .outcome()
        .await?
        .ok_or_else(|| ApiError::not_found("schema", uri))?;
    Ok(Reply::ok(json!({"schema": render_schema(&entry, true)}).to_string()))
}

async fn delete(app: &AppState, uri: &str) -> Result<Reply, ApiError> {
    let entry = app.backend.delete_schema(known_uri(uri)?.to_string()).outcome().await?;
    Ok(Reply::ok(json!({"deleted": true, "uri": entry.uri}).to_string()))
}

/// Percent-encodes everything but unreserved characters, for a `Location`.
fn encode_path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Every registered schema by URI.
async fn all_schemas(app: &AppState) -> Result<HashMap<String, Arc<SchemaEntry>>, ApiError> {
    let mut all = HashMap::new();
    let mut after = None;
    loop {
        let (page, more) = app.backend.schemas_page(after, crate::limits::PAGE_SIZE_MAX).outcome().await?;
        after = page.last().map(|entry| entry.uri.clone());
        all.extend(page.into_iter().map(|entry| (entry.uri.clone(), entry)));
        if !more || after.is_none() {
            return Ok(all);
        }
    }
}
