//! The webhook subscription endpoints (docs/api.md, "Webhooks"), under
//! `/svc/v1/webhooks` and its alias `/svc/v1/webhooks/subscriptions`.
//! Secrets go in and never come out.

use hyper::{Method, StatusCode};
use serde_json::{Value, json};

use super::auth::Role;
use super::error::ApiError;
use super::paging::{decode_cursor, encode_cursor, page_limit, percent_decode, query_pairs, query_value};
use super::{AppState, Reply};
use crate::engine::WebhookChange;
use crate::job::SubscriptionId;
use crate::job::time::format_timestamp;
use crate::webhook::Subscription;
use crate::webhook::subscription::{parse_secret_body, parse_subscription, parse_subscription_patch};

/// The webhook routes (path ids as given, checked by the handlers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookRoute {
    List,
    Create,
    Get(String),
    Patch(String),
    Delete(String),
    AddSecret(String),
    DropPreviousSecret(String),
    Test(String),
}

impl WebhookRoute {
    /// What a path under `/svc/v1/webhooks` takes (`rest`: the segments
    /// after it), also under its alias `/svc/v1/webhooks/subscriptions`.
    pub fn choices(rest: &[&str]) -> Vec<(Method, WebhookRoute)> {
        let rest = match rest {
            ["subscriptions", tail @ ..] => tail,
            _ => rest,
        };
        let id = |segment: &str| percent_decode(segment);
        match rest {
            [] => vec![(Method::GET, WebhookRoute::List), (Method::POST, WebhookRoute::Create)],
            [raw] if !raw.is_empty() => vec![
                (Method::GET, WebhookRoute::Get(id(raw))),
                (Method::PATCH, WebhookRoute::Patch(id(raw))),
                (Method::DELETE, WebhookRoute::Delete(id(raw))),
            ],
            [raw, "secrets" | "rotate-secret"] if !raw.is_empty() => {
                vec![(Method::POST, WebhookRoute::AddSecret(id(raw)))]
            }
            [raw, "test"] if !raw.is_empty() => vec![(Method::POST, WebhookRoute::Test(id(raw)))],
            [raw, "secrets", "previous"] if !raw.is_empty() => {
                vec![(Method::DELETE, WebhookRoute::DropPreviousSecret(id(raw)))]
            }
            _ => Vec::new(),
        }
    }

    /// The metrics number, method and template (as the router's templates).
    pub fn template(&self) -> (usize, &'static str, &'static str) {
        match self {
            WebhookRoute::List => (42, "GET", "/svc/v1/webhooks"),
            WebhookRoute::Create => (43, "POST", "/svc/v1/webhooks"),
            WebhookRoute::Get(_) => (44, "GET", "/svc/v1/webhooks/{id}"),
            WebhookRoute::Patch(_) => (45, "PATCH", "/svc/v1/webhooks/{id}"),
            WebhookRoute::Delete(_) => (46, "DELETE", "/svc/v1/webhooks/{id}"),
            WebhookRoute::AddSecret(_) => (47, "POST", "/svc/v1/webhooks/{id}/secrets"),
            WebhookRoute::DropPreviousSecret(_) => (48, "DELETE", "/svc/v1/webhooks/{id}/secrets/previous"),
            WebhookRoute::Test(_) => (49, "POST", "/svc/v1/webhooks/{id}/test"),
        }
    }

    /// Subscriptions are the operator's.
    pub fn allows(&self, role: Role) -> bool {
        role == Role::Admin
    }

    pub async fn handle(self, app: &AppState, query: &str, body: &[u8]) -> Result<Reply, ApiError> {
        match self {
            WebhookRoute::List => list(app, query).await,
            WebhookRoute::Create => create(app, body).await,
            WebhookRoute::Get(id) => get(app, &id).await,
            WebhookRoute::Patch(id) => patch(app, &id, body).await,
            WebhookRoute::Delete(id) => delete(app, &id).await,
            WebhookRoute::AddSecret(id) => add_secret(app, &id, body).await,
            WebhookRoute::DropPreviousSecret(id) => drop_previous_secret(app, &id).await,
            WebhookRoute::Test(id) => test(app, &id).await,
        }
    }

    #[cfg(test)]
    pub fn samples() -> Vec<WebhookRoute> {
        let id = || "x".to_string();
        vec![
            WebhookRoute::List,
            WebhookRoute::Create,
            WebhookRoute::Get(id()),
            WebhookRoute::Patch(id()),
            WebhookRoute::Delete(id()),
            WebhookRoute::AddSecret(id()),
            WebhookRoute::DropPreviousSecret(id()),
            WebhookRoute::Test(id()),
        ]
    }
}

/// `sub_<uuidv7>`.
pub fn subscription_id(id: SubscriptionId) -> String {
    format!("sub_{id}")
}

/// A path id that is not `sub_<uuidv7>` names no subscription: 404.
fn parse_id(text: &str) -> Result<SubscriptionId, ApiError> {
    text.strip_prefix("sub_")
        .and_then(SubscriptionId::parse_any_case)
        .ok_or_else(|| ApiError::not_found("webhook", text))
}

/// The subscription object, as it stands now: never a secret.
pub fn render_subscription(subscription: &Subscription, now: crate::clock::Millis) -> Value {
    let settled = subscription.settled(now);
    let mut out = json!({
        "id": subscription_id(settled.id),
        "url": settled.url,
        "events": settled.events,
        "active": settled.active,
        "metadata": serde_json::from_str::<Value>(&settled.metadata).unwrap_or_else(|_| json!({})),
        "created_at": format_timestamp(settled.created_at),
        "updated_at": format_timestamp(settled.updated_at),
    });
    if let Some(filter) = &settled.filter {
        let mut rendered = json!({});
        if let Some(queues) = &filter.queues {
            rendered["queues"] = json!(queues);
        }
        if let Some(job_types) = &filter.job_types {
            rendered["job_types"] = json!(job_types);
        }
        out["filter"] = rendered;
    }
    if let Some(rotation) = &settled.rotation {
        out["secret_rotation"] = json!({
            "started_at": format_timestamp(rotation.started_at),
            "previous_expires_at": format_timestamp(rotation.expires_at),
        });
    }
    out
}

fn now(app: &AppState) -> crate::clock::Millis {
    crate::clock::Clock::now_ms(app.clock.as_ref())
}

fn subscription_body(app: &AppState, subscription: &Subscription) -> String {
    json!({"subscription": render_subscription(subscription, now(app))}).to_string()
}

async fn create(app: &AppState, body: &[u8]) -> Result<Reply, ApiError> {
    let new = parse_subscription(body, app.webhooks_allow_private_targets)?;
    let subscription = app.backend.create_webhook(new).outcome().await?;
    Ok(Reply::ok(subscription_body(app, &subscription))
        .with_status(StatusCode::CREATED)
        .header(hyper::header::LOCATION, format!("/svc/v1/webhooks/{}", subscription_id(subscription.id))))
}

async fn list(app: &AppState, query: &str) -> Result<Reply, ApiError> {
    let pairs = query_pairs(query);
    let limit = page_limit(&pairs)?;
    let after =
        match query_value(&pairs, "cursor").filter(|cursor| !cursor.is_empty()) {
            None => None,
            Some(cursor) => {
                let text = decode_cursor(cursor)?;
                Some(SubscriptionId::parse_any_case(&text).ok_or_else(|| {
                    ApiError::invalid_request(Some("cursor"), "cursor is not one this server gave out")
                })?)
            }
        };
    let (page, has_more) = app.backend.webhooks_page(after, limit).outcome().await?;
    let cursor = if has_more { page.last().map(|last| Value::from(encode_cursor(&last.id.to_string()))) } else { None };
    let now = now(app);
    let subscriptions: Vec<Value> = page.iter().map(|subscription| render_subscription(subscription, now)).collect();
    Ok(Reply::ok(json!({"subscriptions": subscriptions, "cursor": cursor, "has_more": has_more}).to_string()))
}

async fn get(app: &AppState, id: &str) -> Result<Reply, ApiError> {
    let subscription =
        app.backend.webhook(parse_id(id)?).outcome().await?.ok_or_else(|| ApiError::not_found("webhook", id))?;
    Ok(Reply::ok(subscription_body(app, &subscription)))
}

async fn patch(app: &AppState, id: &str, body: &[u8]) -> Result<Reply, ApiError> {
    let id = parse_id(id)?;
    let patch = parse_subscription_patch(body, app.webhooks_allow_private_targets)?;
    let subscription = app.backend.change_webhook(id, WebhookChange::Patch(patch)).outcome().await?;
    Ok(Reply::ok(subscription_body(app, &subscription)))
}

async fn delete(app: &AppState, id: &str) -> Result<Reply, ApiError> {
    let subscription = app.backend.delete_webhook(parse_id(id)?).outcome().await?;
    Ok(Reply::ok(json!({"deleted": true, "id": subscription_id(subscription.id)}).to_string()))
}

async fn add_secret(app: &AppState, id: &str, body: &[u8]) -> Result<Reply, ApiError> {
    let id = parse_id(id)?;
    let secret = parse_secret_body(body)?;
    let subscription = app.backend.change_webhook(id, WebhookChange::AddSecret(secret)).outcome().await?;
    Ok(Reply::ok(subscription_body(app, &subscription)))
}

async fn drop_previous_secret(app: &AppState, id: &str) -> Result<Reply, ApiError> {
    let id = parse_id(id)?;
    let subscription = app.backend.change_webhook(id, WebhookChange::DropPreviousSecret).outcome().await?;
    Ok(Reply::ok(subscription_body(app, &subscription)))
}

/// The longest a test attempt may take, whatever the attempt timeout.
const TEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `POST /webhooks/{id}/test`: one attempt of a `webhook.test` event, now,
/// signed and guarded like a delivery; nothing is stored, nothing retried.
async fn test(app: &AppState, id: &str) -> Result<Reply, ApiError> {
    let id = parse_id(id)?;
    let subscription =
        app.backend.webhook(id).outcome().await?.ok_or_else(|| ApiError::not_found("webhook", subscription_id(id)))?;
    let client = app
        .webhook_client
        .as_ref()
        .ok_or_else(|| ApiError::new("backend_error", "webhook deliveries are not set up on this server"))?;
    let now = now(app);
    let (event_id, delivery_id) = {
        let mut ids = app.request_ids.lock();
        (ids.next(now, rand::random()), ids.next(now, rand::random()))
    };
    let event_id = format!("evt_{event_id}");
    let delivery_id = format!("del_{delivery_id}");
    let body = json!({
        "specversion": "1.0",
        "id": event_id,
        "type": "webhook.test",
        "source": "svc://svc/webhooks",
        "time": format_timestamp(now),
        "subject": subscription_id(id),
        "datacontenttype": "application/json",
        "data": {"subscription_id": subscription_id(id), "message": "test event"},
    })
    .to_string();
    let attempt = crate::webhook::client::Attempt {
        subscription: &subscription,
        delivery_id: &delivery_id,
        event_type: "webhook.test",
        body: body.into(),
        now,
        timeout: app.webhook_timeout.min(TEST_TIMEOUT),
    };
    let outcome = client.send(attempt).await;
    let mut answer = json!({
        "success": outcome.succeeded(),
        "response_time_ms": outcome.elapsed_ms,
        "delivery_id": delivery_id,
        "event_id": event_id,
    });
    if let Some(status) = outcome.status {
        answer["status_code"] = status.into();
    }
    if let Some(error) = outcome.error {
        answer["error"] = error.as_str().into();
    }
    if let Some(detail) = outcome.detail {
        answer["error_detail"] = detail.into();
    }
    Ok(Reply::ok(answer.to_string()))
}
