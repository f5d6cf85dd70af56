//! The dashboard's pages and forms over HTTP: every page renders, values
//! are escaped, buttons act and the API agrees, forms need the session's
//! token and the dashboard's own origin, and with keys a sign-in decides
//! who may look (viewer) and who may press (admin).

mod common;

use common::{TestServer, config_for};
use serde_json::json;
use svc::__private::config::Config;
use svc::__private::http::auth::{ApiKey, Role};

const ADMIN: &str = "admin-key-0123456789abcdef0123456789abcdef";
const VIEWER: &str = "viewer-key-0123456789abcdef0123456789abcd";
const PRODUCER: &str = "producer-key-0123456789abcdef0123456789ab";

/// A browser-like client: keeps cookies, does not follow redirects.
fn browser() -> reqwest::blocking::Client {
    common::http_client_builder().cookie_store(true).redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

struct Page {
    status: u16,
    location: Option<String>,
    headers: reqwest::header::HeaderMap,
    html: String,
}

fn get(client: &reqwest::blocking::Client, server: &TestServer, path: &str) -> Page {
    read(client.get(format!("{}{path}", server.base())).send().unwrap())
}

fn post(client: &reqwest::blocking::Client, server: &TestServer, path: &str, form: &[(&str, &str)]) -> Page {
    read(client.post(format!("{}{path}", server.base())).form(form).send().unwrap())
}

fn read(response: reqwest::blocking::Response) -> Page {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let location = headers.get("location").map(|value| value.to_str().unwrap().to_string());
    Page { status, location, headers, html: response.text().unwrap() }
}

/// The form token in a page.
fn csrf(page: &Page) -> String {
    let at = page.html.find("name=\"csrf\" value=\"").expect("a form with a token");
    let rest = &page.html[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_string()
}

#[test]
fn every_page_renders_escaped_with_its_security_headers() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let hostile =
        server.enqueue(json!({"type": "t", "args": ["<script>alert(1)</script>"], "options": {"queue": "mail"}}));
    server.enqueue(json!({"type": "later", "args": [], "options": {"delay_until": "2099-01-01T00:00:00Z"}}));
    let workflow = server.post(
        "/svc/v1/workflows",
        json!({"type": "chain", "name": "flow", "steps": [{"type": "a", "args": []}, {"type": "b", "args": []}]}),
    );
    assert_eq!(workflow.status, 201, "{}", workflow.body);
    let workflow = workflow.body["workflow"]["id"].as_str().unwrap().to_string();
    let client = browser();
    for path in [
        "/ui",
        "/ui/queues",
        "/ui/queues/mail",
        "/ui/jobs",
        "/ui/jobs?state=available&q=alert",
        &format!("/ui/jobs/{hostile}"),
        "/ui/scheduled",
        "/ui/dead-letter",
        "/ui/cron",
        "/ui/workers",
        "/ui/workflows",
        &format!("/ui/workflows/{workflow}"),
        "/ui/events",
    ] {
        let page = get(&client, &server, path);
        assert_eq!(page.status, 200, "{path}: {}", page.html);
        assert!(page.headers["content-type"].to_str().unwrap().starts_with("text/html"), "{path}");
        assert!(page.headers["content-security-policy"].to_str().unwrap().starts_with("default-src 'self'"));
        assert!(!page.html.contains("<script>alert"), "{path} shows args as text");
    }
    let job = get(&client, &server, &format!("/ui/jobs/{hostile}"));
    assert!(job.html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{}", job.html);
    assert!(job.html.contains("<strong>created</strong>"), "the timeline: {}", job.html);
    assert!(get(&client, &server, "/ui/scheduled").html.contains("later"));
    assert!(get(&client, &server, &format!("/ui/workflows/{workflow}")).html.contains("chain"));
    assert_eq!(get(&client, &server, "/ui/jobs/nope").status, 404);
    assert_eq!(get(&client, &server, "/ui/assets/ui.css").status, 200);
}

#[test]
fn buttons_act_and_the_api_agrees_but_only_with_the_token_from_the_same_origin() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let job = server.enqueue(json!({"type": "t", "args": [], "options": {"queue": "mail"}}));
    let client = browser();
    let queues = get(&client, &server, "/ui/queues");
    assert!(queues.html.contains(">Pause</button>"), "{}", queues.html);
    let token = csrf(&queues);

    let forged = post(&client, &server, "/ui/queues/mail/pause", &[("csrf", "forged"), ("next", "/ui/queues")]);
    assert_eq!(forged.status, 403);
    let cross_site = client
        .post(format!("{}/ui/queues/mail/pause", server.base()))
        .header("origin", "https://evil.example")
        .form(&[("csrf", token.as_str())])
        .send()
        .unwrap();
    assert_eq!(cross_site.status(), 403);
    assert_eq!(server.get("/svc/v1/queues/mail/stats").body["paused"], false, "nothing changed");

    let paused = post(&client, &server, "/ui/queues/mail/pause", &[("csrf", &token), ("next", "/ui/queues")]);
    assert_eq!(paused.status, 303);
    assert!(paused.location.as_deref().unwrap().starts_with("/ui/queues?done="), "{:?}", paused.location);
    assert_eq!(server.get("/svc/v1/queues/mail/stats").body["paused"], true);
    let shown = get(&client, &server, paused.location.as_deref().unwrap());
    assert!(shown.html.contains("Queue mail paused."), "{}", shown.html);
    assert!(shown.html.contains(">Resume</button>"));
    post(&client, &server, "/ui/queues/mail/resume", &[("csrf", &token)]);
    assert_eq!(server.get("/svc/v1/queues/mail/stats").body["paused"], false);

    // A job's buttons.
    let cancelled = post(
        &client,
        &server,
        &format!("/ui/jobs/{job}/cancel"),
        &[("csrf", &token), ("next", &format!("/ui/jobs/{job}"))],
    );
    assert_eq!(cancelled.status, 303);
    assert_eq!(server.job(&job)["state"], "cancelled");
    // An open redirect is not followed: back to the overview instead.
    let elsewhere =
        post(&client, &server, "/ui/queues/mail/pause", &[("csrf", &token), ("next", "https://evil.example/")]);
    assert!(elsewhere.location.unwrap().starts_with("/ui?done="));
}

#[test]
fn bulk_buttons_show_the_count_and_act_once_confirmed() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    for n in 0..3 {
        server.enqueue(json!({"type": "t", "args": [n], "options": {"queue": "mail"}}));
    }
    server.enqueue(json!({"type": "t", "args": [], "options": {"queue": "other"}}));
    let client = browser();
    let token = csrf(&get(&client, &server, "/ui/jobs?queue=mail"));
    let form = [("csrf", token.as_str()), ("queue", "mail"), ("next", "/ui/jobs")];
    let asked = post(&client, &server, "/ui/jobs/bulk/cancel", &form);
    assert_eq!(asked.status, 200);
    assert!(asked.html.contains("Cancel all 3"), "{}", asked.html);
    assert_eq!(server.get("/svc/v1/queues/mail/stats").body["states"]["cancelled"], 0, "not yet");
    let confirmed = [("csrf", token.as_str()), ("queue", "mail"), ("next", "/ui/jobs"), ("confirm", "yes")];
    let done = post(&client, &server, "/ui/jobs/bulk/cancel", &confirmed);
    assert_eq!(done.status, 303);
    assert_eq!(server.get("/svc/v1/queues/mail/stats").body["states"]["cancelled"], 3);
    assert_eq!(server.get("/svc/v1/queues/other/stats").body["states"]["available"], 1, "other queues untouched");
}

#[test]
fn with_keys_a_sign_in_decides_who_sees_and_who_acts() {
    let dir = tempfile::tempdir().unwrap();
    let keys = vec![
        ApiKey::from_key("ops".into(), Role::Admin, ADMIN).unwrap(),
        ApiKey::from_key("watch".into(), Role::Viewer, VIEWER).unwrap(),
        ApiKey::from_key("shop".into(), Role::Producer, PRODUCER).unwrap(),
    ];
    let config = Config { api_keys: keys, auth_failed_attempts_per_minute: 0, ..config_for(dir.path()) };
    let server = TestServer::start_checked(&config);

    let viewer = browser();
    let first = get(&viewer, &server, "/ui/queues");
    assert_eq!((first.status, first.location.as_deref()), (303, Some("/ui/sign-in")));
    assert_eq!(post(&viewer, &server, "/ui/sign-in", &[("key", "wrong")]).status, 401);
    assert_eq!(post(&viewer, &server, "/ui/sign-in", &[("key", PRODUCER)]).status, 403, "a producer key cannot");
    let signed_in = post(&viewer, &server, "/ui/sign-in", &[("key", VIEWER)]);
    assert_eq!(signed_in.status, 303);
    let cookie = signed_in.headers["set-cookie"].to_str().unwrap();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict") && cookie.contains("Max-Age="),
        "{cookie}"
    );
    let queues = get(&viewer, &server, "/ui/queues");
    assert_eq!(queues.status, 200);
    assert!(!queues.html.contains(">Pause</button>"), "a viewer sees no buttons");
    let token = csrf(&queues); // the sign-out form's
    assert_eq!(post(&viewer, &server, "/ui/queues/default/pause", &[("csrf", &token)]).status, 403);

    // The API too: a viewer key reads, never acts.
    let api = common::http_client();
    let read = api.get(format!("{}/svc/v1/admin/stats", server.base())).bearer_auth(VIEWER).send().unwrap();
    assert_eq!(read.status(), 200);
    let act =
        api.post(format!("{}/svc/v1/admin/queues/default/pause", server.base())).bearer_auth(VIEWER).send().unwrap();
    assert_eq!(act.status(), 403);

    let admin = browser();
    post(&admin, &server, "/ui/sign-in", &[("key", ADMIN)]);
    let token = csrf(&get(&admin, &server, "/ui/queues"));
    assert_eq!(post(&admin, &server, "/ui/queues/default/pause", &[("csrf", &token)]).status, 303);
    let stats = api.get(format!("{}/svc/v1/queues/default/stats", server.base())).bearer_auth(ADMIN).send().unwrap();
    assert_eq!(stats.json::<serde_json::Value>().unwrap()["paused"], true);

    let signed_out = post(&admin, &server, "/ui/sign-out", &[("csrf", &token)]);
    assert_eq!(signed_out.status, 303);
    assert_eq!(get(&admin, &server, "/ui").location.as_deref(), Some("/ui/sign-in"), "signed out");
    // A forged cookie is no session.
    let forged = browser();
    let page = forged
        .get(format!("{}/ui", server.base()))
        .header("cookie", "svc_session=admin:99999999999:0.AAAA")
        .send()
        .unwrap();
    assert_eq!(page.status(), 303);
}

#[test]
fn behind_a_proxy_every_link_carries_the_prefix_and_other_hosts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config { ui_prefix: "/svc".to_string(), ..config_for(dir.path()) };
    let server = TestServer::start_checked(&config);
    server.enqueue(json!({"type": "t", "args": [], "options": {"queue": "mail"}}));
    let client = browser();
    let queues = get(&client, &server, "/ui/queues");
    assert_eq!(queues.status, 200);
    assert!(queues.html.contains("href=\"/svc/ui/queues/mail\""), "{}", queues.html);
    assert!(queues.html.contains("action=\"/svc/ui/queues/mail/pause\""));
    assert!(!queues.html.contains("href=\"/ui/"), "no link without the prefix");
    let token = csrf(&queues);
    let paused = post(&client, &server, "/ui/queues/mail/pause", &[("csrf", &token), ("next", "/svc/ui/queues")]);
    assert!(paused.location.unwrap().starts_with("/svc/ui/queues?done="));

    // Without keys, pages are for this server's own names only.
    let elsewhere = client.get(format!("{}/ui", server.base())).header("host", "evil.example").send().unwrap();
    assert_eq!(elsewhere.status(), 403);
}
