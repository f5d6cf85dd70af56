//! Dispatch: each route to its handler, in the module of its resource (jobs,
//! workers, queues, dead letter, cron, events, probes), and the helpers they
//! share. A handler parses the request, calls the engine handle and renders
//! the reply.

use bytes::Bytes;

use super::error::ApiError;
use super::router::Route;
use super::{AppState, Reply};

pub async fn handle(app: &AppState, route: Route, query: &str, body: Bytes) -> Result<Reply, ApiError> {
    match route {
        Route::Manifest => Ok(Reply::ok(super::probes::manifest(app).to_string())),
        Route::Health => super::probes::health(app).await,
        Route::Ready => super::probes::ready(app),
        Route::Metrics => super::probes::metrics(app).await,
        Route::OpenApi => Ok(Reply::ok(super::probes::OPENAPI.to_string())),
        Route::ErrorCatalog => Ok(Reply::ok(super::probes::error_catalog().to_string())),
        Route::Jobs(route) => route.handle(app, &body).await,
        Route::Workflows(route) => route.handle(app, &body).await,
        Route::Workers(route) => route.handle(app, query, &body).await,
        Route::Queues(route) => route.handle(app, query, &body).await,
        Route::Events => super::events::events(app, query).await,
        // Served before its body is read (`respond`): it needs the headers.
        Route::EventStream => Err(ApiError::new("not_found", "event streams are opened by respond")),
        Route::DeadLetter(route) => route.handle(app, query, &body).await,
        Route::Cron(route) => route.handle(app, query, &body).await,
        Route::Schemas(route) => route.handle(app, query, &body).await,
        Route::Webhooks(route) => route.handle(app, query, &body).await,
        Route::Progress(route) => route.handle(app, &body).await,
        Route::Admin(route) => route.handle(app, query, &body).await,
    }
}
