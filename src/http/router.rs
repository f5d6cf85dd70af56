//! Exact-path routing (docs/api.md, "Routing"): literal segments win over parameters,
//! no trailing-slash normalisation, path parameters percent-decoded once.

use hyper::Method;

use super::auth::Role;
use super::error::ApiError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Manifest,
    Health,
    Ready,
    ErrorCatalog,
    Metrics,
    OpenApi,
    Jobs(super::jobs::JobRoute),
    Workflows(super::workflows::WorkflowRoute),
    Workers(super::workers::WorkerRoute),
    Queues(super::queues::QueueRoute),
    Events,
    /// Live events, as server-sent events.
    EventStream,
    DeadLetter(super::dead_letter::DeadLetterRoute),
    Cron(super::cron::CronRoute),
    Schemas(super::schemas::SchemaRoute),
    Webhooks(super::webhooks::WebhookRoute),
    Progress(super::progress::ProgressRoute),
    Admin(super::admin::AdminRoute),
}

impl Route {
    /// Discovery and probes: no version check, always served.
    pub fn is_public(&self) -> bool {
        matches!(self, Route::Manifest | Route::Health | Route::Ready | Route::ErrorCatalog | Route::OpenApi)
    }

    /// A number of its own (below `metrics::ROUTES_MAX - 1`), its method and its path template:
    /// how metrics label it, never with the ids in the path.
    pub fn template(&self) -> (usize, &'static str, &'static str) {
        use Route::*;
        match self {
            Manifest => (0, "GET", "/svc/manifest"),
            Health => (1, "GET", "/svc/v1/health"),
            Ready => (2, "GET", "/ready"),
            ErrorCatalog => (3, "GET", "/svc/v1/errors"),
            Metrics => (4, "GET", "/metrics"),
            Jobs(route) => route.template(),
            Workflows(route) => route.template(),
            Workers(route) => route.template(),
            Queues(route) => route.template(),
            Events => (22, "GET", "/svc/v1/events"),
            EventStream => (69, "GET", "/svc/v1/events/stream"),
            DeadLetter(route) => route.template(),
            Cron(route) => route.template(),
            OpenApi => (37, "GET", "/svc/v1/openapi.json"),
            Schemas(route) => route.template(),
            Webhooks(route) => route.template(),
            Progress(route) => route.template(),
            Admin(route) => route.template(),
        }
    }

    /// Whether `role` may use this route (public routes need no key at all).
    pub fn allowed_for(&self, role: Role) -> bool {
        use Route::*;
        if role == Role::Viewer {
            // Reads only, and not webhook subscriptions (their URLs may hold secrets).
            return self.template().1 == "GET" && !matches!(self, Webhooks(_));
        }
        match self {
            Manifest | Health | Ready | ErrorCatalog | Metrics | OpenApi => true,
            Events | EventStream => role == Role::Admin,
            Jobs(route) => route.allows(role),
            Workers(route) => route.allows(role),
            Workflows(route) => route.allows(role),
            DeadLetter(route) => route.allows(role),
            Progress(route) => route.allows(role),
            Queues(route) => route.allows(role),
            Schemas(route) => route.allows(role),
            Cron(route) => route.allows(role),
            Webhooks(route) => route.allows(role),
            Admin(route) => route.allows(role),
        }
    }

    /// One route of each kind, for listing every (method, path template).
    #[cfg(test)]
    fn samples() -> Vec<Route> {
        use Route::*;
        vec![Manifest, Health, Ready, ErrorCatalog, Metrics, Events, EventStream, OpenApi]
            .into_iter()
            .chain(super::jobs::JobRoute::samples().into_iter().map(Route::Jobs))
            .chain(super::workers::WorkerRoute::samples().into_iter().map(Route::Workers))
            .chain(super::progress::ProgressRoute::samples().into_iter().map(Route::Progress))
            .chain(super::queues::QueueRoute::samples().into_iter().map(Route::Queues))
            .chain(super::schemas::SchemaRoute::samples().into_iter().map(Route::Schemas))
            .chain(super::cron::CronRoute::samples().into_iter().map(Route::Cron))
            .chain(super::workflows::WorkflowRoute::samples().into_iter().map(Route::Workflows))
            .chain(super::dead_letter::DeadLetterRoute::samples().into_iter().map(Route::DeadLetter))
            .chain(super::webhooks::WebhookRoute::samples().into_iter().map(Route::Webhooks))
            .chain(super::admin::AdminRoute::samples().into_iter().map(Route::Admin))
            .collect()
    }
}

/// Second spellings the router also takes: (method, path, the route's template).
#[cfg(test)]
const ALIASES: [(&str, &str, &str); 12] = [
    ("POST", "/svc/v1/webhooks/subscriptions/{id}/test", "/svc/v1/webhooks/{id}/test"),
    ("POST", "/svc/v1/jobs/fetch", "/svc/v1/workers/fetch"),
    ("GET", "/health", "/svc/v1/health"),
    ("GET", "/svc/v1/webhooks/subscriptions", "/svc/v1/webhooks"),
    ("POST", "/svc/v1/webhooks/subscriptions", "/svc/v1/webhooks"),
    ("GET", "/svc/v1/webhooks/subscriptions/{id}", "/svc/v1/webhooks/{id}"),
    ("PATCH", "/svc/v1/webhooks/subscriptions/{id}", "/svc/v1/webhooks/{id}"),
    ("DELETE", "/svc/v1/webhooks/subscriptions/{id}", "/svc/v1/webhooks/{id}"),
    ("POST", "/svc/v1/webhooks/subscriptions/{id}/secrets", "/svc/v1/webhooks/{id}/secrets"),
    ("POST", "/svc/v1/webhooks/{id}/rotate-secret", "/svc/v1/webhooks/{id}/secrets"),
    ("POST", "/svc/v1/webhooks/subscriptions/{id}/rotate-secret", "/svc/v1/webhooks/{id}/secrets"),
    ("DELETE", "/svc/v1/webhooks/subscriptions/{id}/secrets/previous", "/svc/v1/webhooks/{id}/secrets/previous"),
];

/// The metrics label of a request no route takes (the index is below
/// `metrics::ROUTES_MAX`, after every route's).
pub const UNKNOWN_ROUTE: (usize, &str) = (crate::metrics::ROUTES_MAX - 1, "unknown");

/// Finds the route for a method and path: 404 for an unknown path, 405 (with
/// `Allow`) for a known path and another method.
pub fn route(method: &Method, path: &str) -> Result<Route, ApiError> {
    let segments: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
    let decoded = |segment: &str| super::paging::percent_decode(segment);
    let choices: Vec<(Method, Route)> = match segments.as_slice() {
        ["svc", "manifest"] => vec![(Method::GET, Route::Manifest)],
        ["health"] | ["svc", "v1", "health"] => vec![(Method::GET, Route::Health)],
        ["ready"] => vec![(Method::GET, Route::Ready)],
        ["metrics"] => vec![(Method::GET, Route::Metrics)],
        ["svc", "v1", "openapi.json"] => vec![(Method::GET, Route::OpenApi)],
        ["svc", "v1", "errors"] => vec![(Method::GET, Route::ErrorCatalog)],
        ["svc", "v1", "jobs", "fetch"] => vec![(Method::POST, Route::Workers(super::workers::WorkerRoute::Fetch))],
        ["svc", "v1", "jobs", id, action @ ("ack" | "fail")] if !id.is_empty() => {
            super::workers::WorkerRoute::job_report_choices(id, action)
                .into_iter()
                .map(|(m, r)| (m, Route::Workers(r)))
                .collect()
        }
        ["svc", "v1", "jobs", id, "progress"] if !id.is_empty() => super::progress::ProgressRoute::choices(decoded(id))
            .into_iter()
            .map(|(m, r)| (m, Route::Progress(r)))
            .collect(),
        ["svc", "v1", "jobs", rest @ ..] => {
            super::jobs::JobRoute::choices(rest).into_iter().map(|(m, r)| (m, Route::Jobs(r))).collect()
        }
        ["svc", "v1", "workers", rest @ ..] => {
            super::workers::WorkerRoute::choices(rest).into_iter().map(|(m, r)| (m, Route::Workers(r))).collect()
        }
        ["svc", "v1", "workflows", rest @ ..] => {
            super::workflows::WorkflowRoute::choices(rest).into_iter().map(|(m, r)| (m, Route::Workflows(r))).collect()
        }
        ["svc", "v1", "queues", rest @ ..] => {
            super::queues::QueueRoute::choices(rest).into_iter().map(|(m, r)| (m, Route::Queues(r))).collect()
        }
        ["svc", "v1", "events"] => vec![(Method::GET, Route::Events)],
        ["svc", "v1", "events", "stream"] => vec![(Method::GET, Route::EventStream)],
        ["svc", "v1", "dead-letter", rest @ ..] => super::dead_letter::DeadLetterRoute::choices(rest)
            .into_iter()
            .map(|(m, r)| (m, Route::DeadLetter(r)))
            .collect(),
        ["svc", "v1", "cron", rest @ ..] => {
            super::cron::CronRoute::choices(rest).into_iter().map(|(m, r)| (m, Route::Cron(r))).collect()
        }
        ["svc", "v1", "webhooks", rest @ ..] => {
            super::webhooks::WebhookRoute::choices(rest).into_iter().map(|(m, r)| (m, Route::Webhooks(r))).collect()
        }
        ["svc", "v1", "admin", rest @ ..] => {
            super::admin::AdminRoute::choices(rest).into_iter().map(|(m, r)| (m, Route::Admin(r))).collect()
        }
        ["svc", "v1", "schemas", rest @ ..] => {
            super::schemas::SchemaRoute::choices(rest).into_iter().map(|(m, r)| (m, Route::Schemas(r))).collect()
        }
        _ => Vec::new(),
    };
    if choices.is_empty() {
        return Err(ApiError::new("not_found", format!("no route for {path}"))
            .detail("resource_type", "route")
            .detail("resource_id", path));
    }
    let allowed: Vec<String> = choices.iter().map(|(method, _)| method.to_string()).collect();
    let allow = allowed.join(", ");
    match choices.into_iter().find(|(candidate, _)| candidate == method) {
        Some((_, route)) => Ok(route),
        None => {
            let mut error =
                ApiError::new("method_not_allowed", format!("{method} is not allowed on {path}; allowed: {allow}"))
                    .detail("allowed_methods", allowed);
            error.headers.push((hyper::header::ALLOW, allow));
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::jobs::JobRoute;
    use crate::http::schemas::SchemaRoute;
    use crate::http::workers::WorkerRoute;

    #[test]
    fn roles_follow_the_table() {
        let create = Route::Jobs(JobRoute::Create);
        assert!(create.allowed_for(Role::Producer) && !create.allowed_for(Role::Worker));
        let fetch = Route::Workers(WorkerRoute::Fetch);
        assert!(fetch.allowed_for(Role::Worker) && !fetch.allowed_for(Role::Producer));
        assert!(Route::Jobs(JobRoute::Get("x".into())).allowed_for(Role::Worker));
        assert!(
            !Route::Workflows(crate::http::workflows::WorkflowRoute::Cancel("x".into())).allowed_for(Role::Producer)
        );
        let crons = Route::Cron(crate::http::cron::CronRoute::List);
        assert!(crons.allowed_for(Role::Admin) && !crons.allowed_for(Role::Producer));
        assert!(crons.allowed_for(Role::Viewer), "a viewer reads");
        let pause = Route::Admin(crate::http::admin::AdminRoute::PauseQueue("q".into(), true));
        assert!(pause.allowed_for(Role::Admin) && !pause.allowed_for(Role::Viewer), "a viewer does not act");
        let webhooks = Route::Webhooks(crate::http::webhooks::WebhookRoute::List);
        assert!(!webhooks.allowed_for(Role::Viewer));
    }

    #[test]
    fn the_openapi_document_has_every_route_and_no_other() {
        let document: serde_json::Value = serde_json::from_str(super::super::probes::OPENAPI).unwrap();
        let mut documented: Vec<(String, String)> = Vec::new();
        for (path, operations) in document["paths"].as_object().unwrap() {
            for method in operations.as_object().unwrap().keys() {
                if ["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                    documented.push((method.to_uppercase(), path.clone()));
                }
            }
        }
        let mut routed: Vec<(String, String)> = Route::samples()
            .iter()
            .map(|route| route.template())
            .map(|(_, m, p)| (m.to_string(), p.to_string()))
            .collect();
        routed.extend(ALIASES.iter().map(|(m, p, _)| (m.to_string(), p.to_string())));
        // Parameter names may differ ({id}, {job_id}); their places may not.
        let shape = |(method, path): (String, String)| {
            let mut out = String::new();
            let mut inside = false;
            for c in path.chars() {
                match c {
                    '{' => inside = true,
                    '}' => {
                        inside = false;
                        out.push_str("{}");
                    }
                    _ if !inside => out.push(c),
                    _ => {}
                }
            }
            (method, out)
        };
        let mut documented: Vec<_> = documented.into_iter().map(shape).collect();
        let mut routed: Vec<_> = routed.into_iter().map(shape).collect();
        documented.sort();
        routed.sort();
        assert_eq!(documented, routed);
    }

    #[test]
    fn the_documented_error_codes_are_the_error_table() {
        let document: serde_json::Value = serde_json::from_str(super::super::probes::OPENAPI).unwrap();
        let codes = &document["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"];
        let table: Vec<&str> = crate::engine::ERROR_CODES.iter().map(|row| row.0).collect();
        assert_eq!(codes, &serde_json::json!(table));
    }

    #[test]
    fn every_template_routes_to_its_own_kind() {
        let samples = Route::samples();
        let mut indexes: Vec<usize> = samples.iter().map(|route| route.template().0).collect();
        indexes.sort_unstable();
        assert_eq!(indexes, (0..samples.len()).collect::<Vec<_>>(), "one index each, none skipped");
        for sample in &samples {
            let (_, method, template) = sample.template();
            let path = template.replace("{id}", "x").replace("{name}", "x").replace("{uri}", "x");
            let method: Method = method.parse().unwrap();
            let routed = route(&method, &path).unwrap();
            assert_eq!(routed.template(), sample.template(), "{method} {path}");
        }
        for (method, path, template) in ALIASES {
            let path = path.replace("{id}", "x");
            assert_eq!(route(&method.parse().unwrap(), &path).unwrap().template().2, template);
        }
    }

    #[test]
    fn literal_segments_win_over_ids() {
        assert_eq!(route(&Method::POST, "/svc/v1/jobs/batch").unwrap(), Route::Jobs(JobRoute::Batch));
        assert_eq!(route(&Method::POST, "/svc/v1/jobs/fetch").unwrap(), Route::Workers(WorkerRoute::Fetch));
        assert_eq!(route(&Method::GET, "/svc/v1/jobs/abc").unwrap(), Route::Jobs(JobRoute::Get("abc".into())));
    }

    #[test]
    fn unknown_paths_and_methods() {
        assert_eq!(route(&Method::GET, "/svc/v1/jobs/").unwrap_err().code, "not_found");
        assert_eq!(route(&Method::GET, "/nope").unwrap_err().code, "not_found");
        let error = route(&Method::GET, "/svc/v1/jobs").unwrap_err();
        assert_eq!(error.code, "method_not_allowed");
        assert_eq!(error.headers, vec![(hyper::header::ALLOW, "POST".to_string())]);
    }

    #[test]
    fn a_schema_uri_takes_the_rest_of_the_path() {
        assert_eq!(
            route(&Method::GET, "/svc/v1/schemas/urn%3Asvc%3Aemail%3Av1").unwrap(),
            Route::Schemas(SchemaRoute::Get("urn:svc:email:v1".into()))
        );
        assert_eq!(
            route(&Method::DELETE, "/svc/v1/schemas/https://example.com/s/a.json").unwrap(),
            Route::Schemas(SchemaRoute::Delete("https://example.com/s/a.json".into()))
        );
        assert_eq!(route(&Method::GET, "/svc/v1/schemas/").unwrap_err().code, "not_found");
    }

    #[test]
    fn ids_are_decoded_once() {
        assert_eq!(
            route(&Method::GET, "/svc/v1/jobs/a%2Fb%2541").unwrap(),
            Route::Jobs(JobRoute::Get("a/b%41".into()))
        );
    }
}
