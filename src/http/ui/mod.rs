//! The dashboard (docs/dashboard.md): server-rendered pages under `/ui`,
//! every action a `<form>` that posts and redirects. Pages read and act
//! through the same backend as the API.
//!
//! Who may press what: with API keys configured, signing in takes a key and
//! sets a signed session cookie (`HttpOnly`, `SameSite=Strict`, 12 hours);
//! the admin role acts, the viewer role only sees. Without keys the
//! dashboard is the server's loopback-only rule: the page must come from
//! the host it is served on. Every post must come from the dashboard's own
//! origin and carry the session's form token. Pages are sent with a
//! Content-Security-Policy of `default-src 'self'`, and everything shown is
//! escaped (maud escapes every value it writes).

mod actions;
mod layout;
mod pages;
pub(super) mod session;

pub use session::{SessionKey, UI_PATH};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderMap, HeaderName, LOCATION, SET_COOKIE};
use hyper::{Method, Request, StatusCode};

use super::auth::Role;
use super::error::ApiError;
use super::paging::{percent_decode, query_pairs};
use super::{AppState, Principal, Reply};

/// How long a session lasts.
const SESSION_SECONDS: u64 = 12 * 60 * 60;
const SESSION_COOKIE: &str = "svc_session";
const THEME_COOKIE: &str = "svc_theme";
/// Most bytes of a form post.
const FORM_BYTES_MAX: usize = 16 * 1024;
const CSP: HeaderName = HeaderName::from_static("content-security-policy");
const FRAME_OPTIONS: HeaderName = HeaderName::from_static("x-frame-options");
const SECURITY_POLICY: &str =
    "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'";

/// Who is looking: their role, and the token their forms carry.
#[derive(Debug, Clone)]
pub(super) struct Viewer {
    pub role: Role,
    pub csrf: String,
    /// Whether the server has keys (then there is a sign-out).
    pub signed_in: bool,
    pub theme: Option<String>,
}

impl Viewer {
    pub fn may_act(&self) -> bool {
        self.role == Role::Admin
    }
}

/// Whether `path` is the dashboard's.
pub fn is_ui_path(path: &str) -> bool {
    path == UI_PATH || path.strip_prefix(UI_PATH).is_some_and(|rest| rest.starts_with('/'))
}

/// Serves a dashboard request: a page, an asset, a sign-in, or an action;
/// a failure is a page too.
pub async fn serve(app: &AppState, client: &Principal, request: Request<Incoming>) -> Reply {
    match serve_request(app, client, request).await {
        Ok(reply) => reply,
        Err(error) => {
            let status = error.status();
            page(layout::error_page(app, &error)).with_status(status)
        }
    }
}

async fn serve_request(app: &AppState, client: &Principal, request: Request<Incoming>) -> Result<Reply, ApiError> {
    let path = request.uri().path().to_string();
    let rest: Vec<String> = path[UI_PATH.len()..].split('/').filter(|s| !s.is_empty()).map(percent_decode).collect();
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    let query = request.uri().query().unwrap_or("").to_string();
    if let Some(guard) = &app.browser_guard {
        guard.check_own_page(request.uri(), request.headers())?;
    }
    if let ["assets", name] = rest.as_slice() {
        return layout::asset(name);
    }
    let method = request.method().clone();
    let headers = request.headers().clone();
    let theme = cookie(&headers, THEME_COOKIE).filter(|theme| *theme == "dark" || *theme == "light");
    let theme = theme.map(str::to_string);
    if method == Method::POST {
        same_origin(&headers)?;
        let form = read_form(request).await?;
        if rest.as_slice() == ["sign-in"] {
            return sign_in(app, client, &form, theme);
        }
        if rest.as_slice() == ["theme"] {
            let chosen = if field(&form, "theme") == Some("dark") { "dark" } else { "light" };
            let next = next_page(app, &form);
            return Ok(redirect(&next)
                .header(SET_COOKIE, format!("{THEME_COOKIE}={chosen}; Path=/; SameSite=Strict; Max-Age=31536000")));
        }
        let Some(viewer) = viewer(app, &headers, theme) else {
            return Ok(redirect(&app.ui_link("/sign-in")));
        };
        if field(&form, "csrf") != Some(viewer.csrf.as_str()) {
            return Err(ApiError::new("forbidden", "the form's token is missing or stale; reload the page")
                .detail("reason", "csrf"));
        }
        if rest.as_slice() == ["sign-out"] {
            return Ok(redirect(&app.ui_link("/sign-in"))
                .header(SET_COOKIE, format!("{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")));
        }
        if !viewer.may_act() {
            return Err(super::auth::forbidden(viewer.role));
        }
        return actions::act(app, &viewer, &rest, &form).await;
    }
    if method != Method::GET {
        let mut error = ApiError::new("method_not_allowed", format!("{method} is not allowed on {path}"))
            .detail("allowed_methods", vec!["GET", "POST"]);
        error.headers.push((hyper::header::ALLOW, "GET, POST".into()));
        return Err(error);
    }
    if rest.as_slice() == ["sign-in"] {
        return Ok(page(layout::sign_in_page(app, None, theme.as_deref())));
    }
    let Some(viewer) = viewer(app, &headers, theme) else {
        return Ok(redirect(&app.ui_link("/sign-in")));
    };
    if rest.as_slice() == ["events", "stream"] {
        // The live parts' events, as the API's stream (a viewer may watch).
        return super::stream::open(app, &query, &headers).await;
    }
    pages::page(app, &viewer, &rest, &query_pairs(&query)).await
}

/// The session of this request, if it has a valid one (without keys:
/// everyone, as admin).
fn viewer(app: &AppState, headers: &HeaderMap, theme: Option<String>) -> Option<Viewer> {
    if !app.auth.is_enabled() {
        // No session: the token ties forms to this server.
        let csrf = app.session_key.sign("csrf:local");
        return Some(Viewer { role: Role::Admin, csrf, signed_in: false, theme });
    }
    let value = cookie(headers, SESSION_COOKIE)?;
    let (payload, signature) = value.rsplit_once('.')?;
    let expected = app.session_key.sign(payload);
    if expected.len() != signature.len()
        || expected.bytes().zip(signature.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0
    {
        return None;
    }
    let mut parts = payload.split(':');
    let role = Role::parse(parts.next()?)?;
    let expires: u64 = parts.next()?.parse().ok()?;
    if expires <= now_s() || !matches!(role, Role::Admin | Role::Viewer) {
        return None;
    }
    let csrf = app.session_key.sign(&format!("csrf:{value}"));
    Some(Viewer { role, csrf, signed_in: true, theme })
}

fn now_s() -> u64 {
    crate::clock::Clock::now_ms(&crate::clock::SystemClock).max(0) as u64 / 1000
}

/// `POST /ui/sign-in` with a key: a session for an admin or viewer key.
fn sign_in(
    app: &AppState,
    client: &Principal,
    form: &[(String, String)],
    theme: Option<String>,
) -> Result<Reply, ApiError> {
    if !app.auth.is_enabled() {
        return Ok(redirect(&app.ui_link("")));
    }
    let now = now_s();
    if let (Some(limiter), Some(window)) = (&app.failed_attempts, client.failed_attempts.as_deref())
        && limiter.exhausted(window, now)
    {
        return Ok(page(layout::sign_in_page(
            app,
            Some("Too many wrong keys from this address; wait a minute."),
            theme.as_deref(),
        ))
        .with_status(StatusCode::TOO_MANY_REQUESTS));
    }
    let key = field(form, "key").unwrap_or("").trim();
    let mut headers = HeaderMap::new();
    if let Ok(value) = format!("Bearer {key}").parse() {
        headers.insert(hyper::header::AUTHORIZATION, value);
    }
    let role = match app.auth.authenticate(&headers) {
        Ok((_, key)) if matches!(key.role, Role::Admin | Role::Viewer) => key.role,
        Ok(_) => {
            let message = "This key's role cannot use the dashboard; sign in with an admin or viewer key.";
            return Ok(
                page(layout::sign_in_page(app, Some(message), theme.as_deref())).with_status(StatusCode::FORBIDDEN)
            );
        }
        Err(_) => {
            if let (Some(limiter), Some(window)) = (&app.failed_attempts, client.failed_attempts.as_deref()) {
                limiter.take(window, now);
            }
            let message = "That key is not valid.";
            return Ok(
                page(layout::sign_in_page(app, Some(message), theme.as_deref())).with_status(StatusCode::UNAUTHORIZED)
            );
        }
    };
    let nonce: u64 = rand::random();
    let payload = format!("{}:{}:{nonce:016x}", role.as_str(), now + SESSION_SECONDS);
    let value = format!("{payload}.{}", app.session_key.sign(&payload));
    let cookie = format!("{SESSION_COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={SESSION_SECONDS}");
    Ok(redirect(&app.ui_link("")).header(SET_COOKIE, cookie))
}

/// A post must come from a page of this server: `Sec-Fetch-Site` (when
/// the browser sends it) says same-origin, and `Origin` (when sent) names
/// the host the request went to.
fn same_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    let refused = || {
        ApiError::new("forbidden", "dashboard forms are taken from the dashboard's own pages only")
            .detail("reason", "cross_site")
    };
    if let Some(site) = headers.get("sec-fetch-site").and_then(|value| value.to_str().ok())
        && !matches!(site, "same-origin" | "none")
    {
        return Err(refused());
    }
    if let Some(origin) = headers.get(hyper::header::ORIGIN) {
        let host = headers.get(hyper::header::HOST).and_then(|value| value.to_str().ok()).unwrap_or("");
        let origin = origin.to_str().unwrap_or("");
        let own = ["http://", "https://"].iter().any(|scheme| origin.eq_ignore_ascii_case(&format!("{scheme}{host}")));
        if !own {
            return Err(refused());
        }
    }
    Ok(())
}

/// Reads an `application/x-www-form-urlencoded` body.
async fn read_form(request: Request<Incoming>) -> Result<Vec<(String, String)>, ApiError> {
    let content_type = request.headers().get(CONTENT_TYPE).and_then(|value| value.to_str().ok()).unwrap_or("");
    if !content_type.is_empty() && !content_type.starts_with("application/x-www-form-urlencoded") {
        return Err(ApiError::new("unsupported", "dashboard forms are sent as application/x-www-form-urlencoded"));
    }
    let limited = http_body_util::Limited::new(request.into_body(), FORM_BYTES_MAX);
    let bytes: Bytes = limited
        .collect()
        .await
        .map_err(|_| ApiError::new("envelope_too_large", format!("a form takes at most {FORM_BYTES_MAX} bytes")))?
        .to_bytes();
    let text = std::str::from_utf8(&bytes).map_err(|_| ApiError::invalid_request(None, "the form is not UTF-8"))?;
    Ok(query_pairs(text))
}

pub(super) fn field<'a>(form: &'a [(String, String)], name: &str) -> Option<&'a str> {
    form.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(hyper::header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// Where a form says to go back to: a dashboard page, else the overview.
pub(super) fn next_page(app: &AppState, form: &[(String, String)]) -> String {
    match field(form, "next") {
        Some(next) if next.starts_with(&app.ui_link("/")) && !next.contains("//") && !next.contains('\\') => {
            next.to_string()
        }
        _ => app.ui_link(""),
    }
}

/// A 303 to `location`.
pub(super) fn redirect(location: &str) -> Reply {
    Reply::ok(String::new()).with_status(StatusCode::SEE_OTHER).header(LOCATION, location.to_string())
}

/// An HTML page, with the dashboard's security headers.
pub(super) fn page(markup: maud::Markup) -> Reply {
    Reply::ok(markup.into_string())
        .header(CONTENT_TYPE, "text/html; charset=utf-8".into())
        .header(CSP, SECURITY_POLICY.into())
        .header(FRAME_OPTIONS, "DENY".into())
        .header(hyper::header::CACHE_CONTROL, "no-store".into())
}
