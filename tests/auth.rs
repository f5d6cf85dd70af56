//! API keys and roles (docs/api.md, "Authentication"): every route with no
//! key, a wrong key, and a key of each role; key material never in a
//! response; failed attempts counted against the address, and wrong keys
//! limited per address; keys from the environment and as digests, never a
//! weak one's digest nor one key twice; the manifest's scheme.

mod common;

use common::{TestServer, config_for};
use serde_json::{Value, json};
use svc::__private::config::Config;
use svc::__private::http::auth::{ApiKey, Role};

const ADMIN: &str = "admin-key-0123456789abcdef0123456789abcdef";
const PRODUCER: &str = "producer-key-0123456789abcdef0123456789ab";
const WORKER: &str = "worker-key-0123456789abcdef0123456789abcd";

fn keys() -> Vec<ApiKey> {
    vec![
        ApiKey::from_key("ops".into(), Role::Admin, ADMIN).unwrap(),
        ApiKey::from_key("shop".into(), Role::Producer, PRODUCER).unwrap(),
        ApiKey::from_key("mailer".into(), Role::Worker, WORKER).unwrap(),
    ]
}

/// A server with the three keys, and without the limit of wrong keys, which
/// these tests send many of.
fn start(dir: &std::path::Path, rate_limit: Option<(u64, u64)>) -> TestServer {
    let config = Config { api_keys: keys(), rate_limit, auth_failed_attempts_per_minute: 0, ..config_for(dir) };
    TestServer::start_checked(&config)
}

fn send(server: &TestServer, method: &str, path: &str, body: Option<&Value>, key: Option<&str>) -> (u16, Value) {
    let client = common::http_client();
    let url = format!("{}{path}", server.base());
    let mut request = match method {
        "GET" => client.get(url),
        "DELETE" => client.delete(url),
        "PATCH" => client.patch(url),
        "PUT" => client.put(url),
        _ => client.post(url),
    };
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    if let Some(body) = body {
        request = request.header("content-type", "application/svc+json").body(body.to_string());
    }
    let response = request.send().unwrap();
    let status = response.status().as_u16();
    let text = response.text().unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[test]
fn every_route_asks_for_a_key_and_the_right_role() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), None);
    let id = "019539a4-0000-7000-8000-000000000000";
    let job = json!({"type": "t", "args": []});
    // (method, path, body, roles allowed: admin, producer, worker)
    let table: Vec<(&str, String, Option<Value>, [bool; 3])> = vec![
        ("POST", "/svc/v1/jobs".into(), Some(job.clone()), [true, true, false]),
        ("POST", "/svc/v1/jobs/batch".into(), Some(json!({"jobs": [job]})), [true, true, false]),
        ("GET", format!("/svc/v1/jobs/{id}"), None, [true, true, true]),
        ("DELETE", format!("/svc/v1/jobs/{id}"), None, [true, true, false]),
        ("POST", format!("/svc/v1/jobs/{id}/activate"), None, [true, true, false]),
        ("POST", "/svc/v1/workers/fetch".into(), Some(json!({"queues": ["q"]})), [true, false, true]),
        ("POST", "/svc/v1/jobs/fetch".into(), Some(json!({"queues": ["q"]})), [true, false, true]),
        ("POST", "/svc/v1/workers/ack".into(), Some(json!({"job_id": id})), [true, false, true]),
        ("POST", format!("/svc/v1/jobs/{id}/ack"), None, [true, false, true]),
        (
            "POST",
            "/svc/v1/workers/nack".into(),
            Some(json!({"job_id": id, "error": {"message": "m"}})),
            [true, false, true],
        ),
        ("POST", format!("/svc/v1/jobs/{id}/fail"), Some(json!({"error": {"message": "m"}})), [true, false, true]),
        ("PUT", format!("/svc/v1/jobs/{id}/progress"), Some(json!({"progress": 0.5})), [true, false, true]),
        ("GET", format!("/svc/v1/jobs/{id}/progress"), None, [true, true, true]),
        ("POST", "/svc/v1/workers/heartbeat".into(), Some(json!({"worker_id": "w"})), [true, false, true]),
        (
            "POST",
            "/svc/v1/workflows".into(),
            Some(json!({"type": "group", "jobs": [{"type": "t"}]})),
            [true, true, false],
        ),
        ("GET", format!("/svc/v1/workflows/{id}"), None, [true, true, false]),
        ("DELETE", format!("/svc/v1/workflows/{id}"), None, [true, false, false]),
        ("GET", "/svc/v1/queues".into(), None, [true, false, false]),
        ("GET", "/svc/v1/queues/default/stats".into(), None, [true, false, false]),
        ("POST", "/svc/v1/queues/q/pause".into(), None, [true, false, false]),
        ("POST", "/svc/v1/queues/q/resume".into(), None, [true, false, false]),
        ("GET", "/svc/v1/events".into(), None, [true, false, false]),
        ("GET", "/svc/v1/workers".into(), None, [true, false, false]),
        ("GET", "/svc/v1/workers/w".into(), None, [true, false, false]),
        ("DELETE", "/svc/v1/workers/w".into(), None, [true, false, false]),
        ("POST", "/svc/v1/workers/w/quiet".into(), None, [true, false, false]),
        ("POST", "/svc/v1/workers/w/terminate".into(), None, [true, false, false]),
        ("GET", "/svc/v1/dead-letter".into(), None, [true, false, false]),
        ("POST", format!("/svc/v1/dead-letter/{id}/retry"), None, [true, false, false]),
        ("DELETE", format!("/svc/v1/dead-letter/{id}"), None, [true, false, false]),
        ("GET", "/svc/v1/cron".into(), None, [true, false, false]),
        (
            "POST",
            "/svc/v1/cron".into(),
            Some(json!({"name": "n", "schedule": "* * * * *", "type": "t"})),
            [true, false, false],
        ),
        ("GET", "/svc/v1/cron/n".into(), None, [true, false, false]),
        ("PATCH", "/svc/v1/cron/n".into(), Some(json!({"enabled": false})), [true, false, false]),
        ("DELETE", "/svc/v1/cron/n".into(), None, [true, false, false]),
        ("GET", "/svc/v1/schemas".into(), None, [true, false, false]),
        ("POST", "/svc/v1/schemas".into(), Some(json!({"uri": "urn:r", "schema": true})), [true, false, false]),
        ("GET", "/svc/v1/schemas/urn:r".into(), None, [true, false, false]),
        ("DELETE", "/svc/v1/schemas/urn:r".into(), None, [true, false, false]),
        ("GET", "/svc/v1/webhooks".into(), None, [true, false, false]),
        ("GET", "/svc/v1/webhooks/subscriptions".into(), None, [true, false, false]),
        (
            "POST",
            "/svc/v1/webhooks".into(),
            Some(json!({"url": "https://h.example/x", "events": ["*"], "secret": "0123456789abcdef"})),
            [true, false, false],
        ),
        (
            "POST",
            "/svc/v1/webhooks/subscriptions".into(),
            Some(json!({"url": "https://h.example/x", "events": ["*"], "secret": "0123456789abcdef"})),
            [true, false, false],
        ),
        ("GET", format!("/svc/v1/webhooks/sub_{id}"), None, [true, false, false]),
        ("PATCH", format!("/svc/v1/webhooks/sub_{id}"), Some(json!({"active": false})), [true, false, false]),
        ("DELETE", format!("/svc/v1/webhooks/sub_{id}"), None, [true, false, false]),
        (
            "POST",
            format!("/svc/v1/webhooks/sub_{id}/secrets"),
            Some(json!({"secret": "x".repeat(16)})),
            [true, false, false],
        ),
        (
            "POST",
            format!("/svc/v1/webhooks/sub_{id}/rotate-secret"),
            Some(json!({"secret": "x".repeat(16)})),
            [true, false, false],
        ),
        ("DELETE", format!("/svc/v1/webhooks/sub_{id}/secrets/previous"), None, [true, false, false]),
        ("GET", format!("/svc/v1/webhooks/subscriptions/sub_{id}"), None, [true, false, false]),
    ];
    for (method, path, body, allowed) in &table {
        let (status, answer) = send(&server, method, path, body.as_ref(), None);
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (401, Some("unauthorized")),
            "{method} {path} without a key"
        );
        let (status, _) =
            send(&server, method, path, body.as_ref(), Some("not-a-key-but-long-enough-to-look-like-one"));
        assert_eq!(status, 401, "{method} {path} with a wrong key");
        for (role, key) in [ADMIN, PRODUCER, WORKER].into_iter().enumerate() {
            let (status, answer) = send(&server, method, path, body.as_ref(), Some(key));
            if allowed[role] {
                assert!(status != 401 && status != 403, "{method} {path} as role {role}: {status} {answer}");
            } else {
                assert_eq!(
                    (status, answer["error"]["code"].as_str()),
                    (403, Some("forbidden")),
                    "{method} {path} as role {role}"
                );
                assert!(answer["error"]["details"]["role"].is_string());
            }
        }
    }
    // The public routes need no key.
    for path in ["/svc/manifest", "/svc/v1/health", "/health", "/ready", "/svc/v1/errors"] {
        assert_eq!(send(&server, "GET", path, None, None).0, 200, "{path}");
    }
    let manifest = send(&server, "GET", "/svc/manifest", None, None).1;
    assert_eq!(manifest["authentication"], json!({"schemes": ["bearer"], "required": true}));
    // Without a key, even an unknown route answers 401: nothing is learnt about routes.
    assert_eq!(send(&server, "GET", "/svc/v1/nothing-here", None, None).0, 401);
}

#[test]
fn a_401_names_the_scheme_and_no_answer_holds_key_material() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), None);
    let response = common::http_client()
        .get(format!("{}/svc/v1/queues", server.base()))
        .header("authorization", format!("Bearer {ADMIN}x"))
        .send()
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);
    assert_eq!(response.headers().get("www-authenticate").unwrap(), "Bearer realm=\"svc\"");
    let text = response.text().unwrap();
    assert!(!text.contains(ADMIN) && !text.contains("admin-key"), "{text}");
    let (_, forbidden) = send(&server, "GET", "/svc/v1/queues", None, Some(WORKER));
    assert!(!forbidden.to_string().contains(WORKER) && !forbidden.to_string().contains("worker-key"));
}

#[test]
fn failed_attempts_count_against_the_address_and_keys_have_windows_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), Some((3, 3600)));
    for _ in 0..3 {
        assert_eq!(send(&server, "GET", "/svc/v1/queues", None, Some("wrong-wrong-wrong-wrong-wrong-wrong")).0, 401);
    }
    let (status, answer) = send(&server, "GET", "/svc/v1/queues", None, Some(ADMIN));
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (429, Some("rate_limited")),
        "over the limit of failed attempts"
    );

    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), Some((2, 3600)));
    assert_eq!(send(&server, "GET", "/svc/v1/queues", None, Some(ADMIN)).0, 200);
    assert_eq!(send(&server, "GET", "/svc/v1/queues", None, Some(ADMIN)).0, 200);
    assert_eq!(send(&server, "GET", "/svc/v1/queues", None, Some(ADMIN)).0, 429);
    let (status, _) = send(
        &server,
        "GET",
        format!("/svc/v1/jobs/{}", "019539a4-0000-7000-8000-000000000000").as_str(),
        None,
        Some(PRODUCER),
    );
    assert_eq!(status, 404, "another key has its own window");
}

#[test]
fn keys_come_from_the_file_the_environment_or_as_digests() {
    use std::collections::HashMap;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("svc.toml");
    // sha256 of a random key (`openssl rand -hex 32 | tr -d '\n' | sha256sum`)
    let digest = "6a889e903f537199388c74817b9e49cbccb9faac68b7975fbc328049c6ecb53e";
    std::fs::write(
        &file,
        format!(
            "listen = \"0.0.0.0:0\"\n[[auth.keys]]\nname = \"ops\"\nrole = \"admin\"\nkey = \"{ADMIN}\"\n\
             [[auth.keys]]\nname = \"ci\"\nrole = \"producer\"\nkey_env = \"CI_KEY\"\n\
             [[auth.keys]]\nname = \"old\"\nrole = \"worker\"\nkey_sha256 = \"{digest}\"\n"
        ),
    )
    .unwrap();
    let args = vec!["--config".to_string(), file.display().to_string()];
    let env: HashMap<String, String> = [("CI_KEY".to_string(), PRODUCER.to_string())].into();
    let config = Config::load(&args, &env).expect("with keys, any address may be bound");
    let names: Vec<(&str, Role)> = config.api_keys.iter().map(|key| (key.name.as_str(), key.role)).collect();
    assert_eq!(names, [("ops", Role::Admin), ("ci", Role::Producer), ("old", Role::Worker)]);
    assert!(!format!("{config:?}").contains(ADMIN) && !format!("{config:?}").contains(PRODUCER));

    for (entry, problem) in [
        ("name = \"a\"\nrole = \"admin\"\nkey = \"short\"", "shorter than 32"),
        ("name = \"a\"\nrole = \"root\"\nkey_sha256 = \"00\"", "role"),
        ("name = \"a\"\nrole = \"admin\"", "exactly one"),
        ("name = \"a\"\nrole = \"admin\"\nkey_env = \"MISSING\"", "not set"),
        // sha256("password"), sha256("test"), sha256(""), upper-case too
        (
            "name = \"a\"\nrole = \"admin\"\nkey_sha256 = \"5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8\"",
            "weak key",
        ),
        (
            "name = \"a\"\nrole = \"admin\"\nkey_sha256 = \"9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08\"",
            "weak key",
        ),
        (
            "name = \"a\"\nrole = \"admin\"\nkey_sha256 = \"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\"",
            "weak key",
        ),
        // the plain-text minimum still holds, for a listed weak key too
        ("name = \"a\"\nrole = \"admin\"\nkey = \"changeme\"", "shorter than 32"),
        (&format!("name = \"a\"\nrole = \"admin\"\nkey = \"{}\"", "k".repeat(31)), "shorter than 32"),
    ] {
        std::fs::write(&file, format!("[[auth.keys]]\n{entry}\n")).unwrap();
        let error = Config::load(&args, &HashMap::new()).unwrap_err();
        assert!(error.contains(problem), "{entry}: {error}");
        assert!(!error.contains("short\""), "no key material in errors: {error}");
    }
    std::fs::write(&file, "listen = \"0.0.0.0:0\"\n").unwrap();
    assert!(Config::load(&args, &HashMap::new()).is_err(), "without keys, only loopback");
}

#[test]
fn one_key_under_two_entries_is_refused_naming_both() {
    use std::collections::HashMap;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("svc.toml");
    let args = vec!["--config".to_string(), file.display().to_string()];
    let env: HashMap<String, String> = [("SAME_KEY".to_string(), ADMIN.to_string())].into();
    let digest: String = {
        use sha2::Digest;
        sha2::Sha256::digest(ADMIN.as_bytes()).iter().map(|byte| format!("{byte:02x}")).collect()
    };
    // The same key as text twice, as text and from the environment, and as
    // text and as its (upper-case) digest; roles differ or not.
    for (first, second) in [
        (format!("key = \"{ADMIN}\""), format!("key = \"{ADMIN}\"")),
        (format!("key = \"{ADMIN}\""), "key_env = \"SAME_KEY\"".to_string()),
        ("key_env = \"SAME_KEY\"".to_string(), format!("key_sha256 = \"{}\"", digest.to_uppercase())),
    ] {
        for second_role in ["admin", "worker"] {
            std::fs::write(
                &file,
                format!(
                    "[[auth.keys]]\nname = \"ops\"\nrole = \"admin\"\n{first}\n\
                     [[auth.keys]]\nname = \"ok\"\nrole = \"producer\"\nkey = \"{PRODUCER}\"\n\
                     [[auth.keys]]\nname = \"mailers\"\nrole = \"{second_role}\"\n{second}\n"
                ),
            )
            .unwrap();
            let error = Config::load(&args, &env).unwrap_err();
            assert!(error.contains("ops and mailers") && error.contains("same key"), "{first} / {second}: {error}");
            assert!(!error.contains(ADMIN) && !error.contains(&digest), "no key material in errors: {error}");
        }
    }
}

/// Sends `count` requests with a wrong key, asserting each is 401.
fn wrong_keys(server: &TestServer, count: usize) {
    for attempt in 0..count {
        let (status, _) = send(server, "GET", "/svc/v1/queues", None, Some("wrong-key-wrong-key-wrong-key-wrong"));
        assert_eq!(status, 401, "wrong key {attempt}");
    }
}

#[test]
fn an_address_sending_ten_wrong_keys_in_a_minute_is_refused_until_the_minute_ends() {
    let dir = tempfile::tempdir().unwrap();
    // As `svc serve` runs with keys and no other setting: the limit is on.
    let config = Config { api_keys: keys(), ..config_for(dir.path()) };
    assert_eq!(config.auth_failed_attempts_per_minute, 10);
    let server = TestServer::start_with(&config, svc::__private::server::engine_config(&config));
    // Requests without a key guess nothing and are not counted.
    for _ in 0..20 {
        assert_eq!(send(&server, "GET", "/svc/v1/queues", None, None).0, 401);
    }
    assert_eq!(send(&server, "GET", "/svc/v1/queues", None, Some(ADMIN)).0, 200);
    // A minute boundary between the attempts would start the count again.
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    if now_s % 60 >= 57 {
        std::thread::sleep(std::time::Duration::from_secs(61 - now_s % 60));
    }
    wrong_keys(&server, 10);
    for key in [Some(ADMIN), Some("wrong-key-wrong-key-wrong-key-wrong"), None] {
        let response = common::http_client()
            .get(format!("{}/svc/v1/queues", server.base()))
            .header("authorization", format!("Bearer {}", key.unwrap_or("")))
            .send()
            .unwrap();
        assert_eq!(response.status().as_u16(), 429, "before the key is looked at: {key:?}");
        let retry_after: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((1..=60).contains(&retry_after), "until the minute ends: {retry_after}");
        let body: Value = response.json().unwrap();
        let error = &body["error"];
        assert_eq!((error["code"].as_str(), error["retryable"].as_bool()), (Some("rate_limited"), Some(true)));
        assert_eq!(error["details"]["reason"], "failed_attempts");
        assert_eq!(
            (error["details"]["limit"].as_u64(), error["details"]["window_seconds"].as_u64()),
            (Some(10), Some(60))
        );
        assert_eq!(error["details"]["retry_after_seconds"].as_u64(), Some(retry_after));
        assert!(error["request_id"].is_string());
    }
    assert_eq!(send(&server, "GET", "/svc/v1/health", None, None).0, 200, "public routes need no key");
}

#[test]
fn the_limit_of_wrong_keys_is_a_setting_and_zero_turns_it_off() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config { api_keys: keys(), auth_failed_attempts_per_minute: 3, ..config_for(dir.path()) };
    let server = TestServer::start_checked(&config);
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    if now_s % 60 >= 57 {
        std::thread::sleep(std::time::Duration::from_secs(61 - now_s % 60));
    }
    wrong_keys(&server, 3);
    let (status, answer) = send(&server, "GET", "/svc/v1/queues", None, Some(ADMIN));
    assert_eq!((status, answer["error"]["details"]["limit"].as_u64()), (429, Some(3)));
    drop(server);

    let dir = tempfile::tempdir().unwrap();
    let config = Config { api_keys: keys(), auth_failed_attempts_per_minute: 0, ..config_for(dir.path()) };
    let server = TestServer::start_checked(&config);
    wrong_keys(&server, 30);
    assert_eq!(send(&server, "GET", "/svc/v1/queues", None, Some(ADMIN)).0, 200);
}

#[test]
fn without_keys_requests_from_web_pages_and_other_hosts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let client = common::http_client();
    let pause = format!("{}/svc/v1/queues/q/pause", server.base());
    let from_page = client.post(&pause).header("origin", "https://evil.example").send().unwrap();
    assert_eq!(from_page.status().as_u16(), 403);
    let body: Value = from_page.json().unwrap();
    assert_eq!(body["error"]["details"]["reason"], "origin_not_allowed");
    let rebound = client.post(&pause).header("host", "evil.example:8080").send().unwrap();
    assert_eq!(rebound.status().as_u16(), 403, "a name rebound to 127.0.0.1");
    for simple_type in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"] {
        let simple = client.post(&pause).header("content-type", simple_type).send().unwrap();
        assert_eq!(simple.status().as_u16(), 400, "{simple_type} on an empty body");
        let body: Value = simple.json().unwrap();
        assert_eq!(body["error"]["details"]["reason"], "unsupported_media_type");
    }
    assert_eq!(server.get("/svc/v1/queues/q/stats").status, 404, "the queue was never paused");
    assert_eq!(client.post(&pause).send().unwrap().status().as_u16(), 200, "a local program");
}

/// Sends `head` (the request line and headers, each line ending in CRLF)
/// on a connection of its own; the status and the JSON body.
fn raw(server: &TestServer, head: &[u8]) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(server.base().trim_start_matches("http://")).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    stream.write_all(head).unwrap();
    stream.write_all(b"Connection: close\r\n\r\n").unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let text = String::from_utf8_lossy(&response);
    let status = text.get(9..12).and_then(|code| code.parse().ok()).unwrap_or_else(|| panic!("{text}"));
    let body = text.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[test]
fn without_keys_the_guard_comes_before_every_route_the_public_ones_too() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config { metrics_public: true, ..config_for(dir.path()) };
    let server = TestServer::start_with(&config, svc::__private::server::engine_config(&config));
    let client = common::http_client();
    let public = ["/svc/manifest", "/svc/v1/health", "/health", "/ready", "/svc/v1/errors", "/svc/v1/openapi.json"];
    for path in public.into_iter().chain(["/metrics", "/svc/v1/queues", "/svc/v1/nothing-here"]) {
        let url = format!("{}{path}", server.base());
        let expected = if path.ends_with("nothing-here") { 404 } else { 200 };
        assert_eq!(client.get(&url).send().unwrap().status().as_u16(), expected, "{path}");
        for (header, value, reason) in [
            ("origin", "https://evil.example", "origin_not_allowed"),
            ("host", "evil.example:8080", "host_not_allowed"),
        ] {
            let response = client.get(&url).header(header, value).send().unwrap();
            assert_eq!(response.status().as_u16(), 403, "{path} with {header}: {value}");
            let body: Value = response.json().unwrap();
            assert_eq!(
                (body["error"]["code"].as_str(), body["error"]["details"]["reason"].as_str()),
                (Some("forbidden"), Some(reason))
            );
            assert!(body["error"]["request_id"].is_string(), "{body}");
        }
    }
}

#[test]
fn without_keys_a_malformed_doubled_or_absolute_form_host_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let port = server.base().rsplit(':').next().unwrap().to_string();
    let refused: Vec<Vec<u8>> = vec![
        b"GET /svc/v1/queues HTTP/1.1\r\nHost: 127.0.0.1\xff\r\n".to_vec(),
        b"GET /svc/v1/queues HTTP/1.1\r\nHost: localhost\xc3\xa9\r\n".to_vec(),
        b"GET /svc/v1/queues HTTP/1.1\r\nHost: [::1]evil.example\r\n".to_vec(),
        b"GET /svc/v1/queues HTTP/1.1\r\nHost: 127.0.0.1:80:80\r\n".to_vec(),
        b"GET /svc/v1/health HTTP/1.1\r\nHost: user@127.0.0.1\r\n".to_vec(),
        b"GET /svc/v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n".to_vec(),
        b"GET /svc/v1/health HTTP/1.1\r\nHost: evil.example\r\nHost: 127.0.0.1\r\n".to_vec(),
        b"GET http://evil.example/svc/v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\n".to_vec(),
        format!("POST http://evil.example:{port}/svc/v1/queues/q/pause HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n").into_bytes(),
        b"GET http://evil.example/svc/manifest HTTP/1.1\r\nHost: localhost\r\n".to_vec(),
    ];
    for head in &refused {
        let (status, body) = raw(&server, head);
        let shown = String::from_utf8_lossy(head);
        assert_eq!((status, body["error"]["details"]["reason"].as_str()), (403, Some("host_not_allowed")), "{shown}");
    }
    assert_eq!(server.get("/svc/v1/queues/q/stats").status, 404, "the queue was never paused");
    let accepted: Vec<Vec<u8>> = vec![
        format!("GET /svc/v1/queues HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n").into_bytes(),
        format!("GET http://127.0.0.1:{port}/svc/v1/queues HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n").into_bytes(),
        format!("GET http://localhost:{port}/svc/v1/health HTTP/1.1\r\nHost: localhost:{port}\r\n").into_bytes(),
        b"GET /svc/v1/queues HTTP/1.0\r\n".to_vec(),
    ];
    for head in &accepted {
        assert_eq!(raw(&server, head).0, 200, "{}", String::from_utf8_lossy(head));
    }
}

#[test]
fn without_keys_behind_a_proxy_web_pages_stay_out_but_allowed_origins_come_in() {
    let dir = tempfile::tempdir().unwrap();
    // --insecure-no-auth, bound beyond loopback (the harness talks to it on 127.0.0.1).
    let config = Config {
        listen: "0.0.0.0:0".into(),
        insecure_no_auth: true,
        http_allowed_origins: vec!["https://admin.example.com".into()],
        ..config_for(dir.path())
    };
    let server = TestServer::start_checked(&config);
    let client = common::http_client();
    let pause = format!("{}/svc/v1/queues/q/pause", server.base());
    // A bodyless cross-site POST: no Content-Type to refuse it by.
    for origin in ["https://evil.example", "null", "https://admin.example.com:8443"] {
        let response = client.post(&pause).header("origin", origin).header("host", "svc.example.com").send().unwrap();
        assert_eq!(response.status().as_u16(), 403, "{origin}");
        let body: Value = response.json().unwrap();
        assert_eq!(body["error"]["details"]["reason"], "origin_not_allowed");
    }
    let health = format!("{}/svc/v1/health", server.base());
    assert_eq!(client.get(&health).header("origin", "https://evil.example").send().unwrap().status().as_u16(), 403);
    assert_eq!(server.get("/svc/v1/queues/q/stats").status, 404, "the queue was never paused");
    // The proxy's host names are its own to judge.
    let proxied =
        client.get(format!("{}/svc/v1/queues", server.base())).header("host", "svc.example.com").send().unwrap();
    assert_eq!(proxied.status().as_u16(), 200);
    let admin = client.post(&pause).header("origin", "https://admin.example.com").send().unwrap();
    assert_eq!(admin.status().as_u16(), 200, "a page of an allowed origin");
    assert_eq!(server.get("/svc/v1/queues/q/stats").body["paused"], true);
}

#[test]
fn without_keys_on_loopback_allowed_origins_come_in_and_hosts_are_still_checked() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config { http_allowed_origins: vec!["http://localhost:3000".into()], ..config_for(dir.path()) };
    let server = TestServer::start_checked(&config);
    let client = common::http_client();
    let queues = format!("{}/svc/v1/queues", server.base());
    assert_eq!(client.get(&queues).header("origin", "http://localhost:3000").send().unwrap().status().as_u16(), 200);
    assert_eq!(client.get(&queues).header("origin", "http://localhost:3001").send().unwrap().status().as_u16(), 403);
    let rebound = client.get(&queues).header("origin", "http://localhost:3000").header("host", "evil.example").send();
    assert_eq!(rebound.unwrap().status().as_u16(), 403, "a name rebound to 127.0.0.1");
}

/// A server run as users run it, logging every request (debug, JSON lines):
/// neither keys, nor job args, meta or results reach its log.
#[test]
fn key_material_and_job_contents_never_reach_the_log() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("svc.toml");
    std::fs::write(&config, "[[auth.keys]]\nname = \"ops\"\nrole = \"admin\"\nkey_env = \"OPS_KEY\"\n").unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(["serve", "--log-format", "json", "--log-level", "debug", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("OPS_KEY", ADMIN)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines().map_while(Result::ok);
    let listening = lines.by_ref().find(|line| line.contains("svc listening")).expect("server starts");
    let address = serde_json::from_str::<Value>(&listening).unwrap()["address"].as_str().unwrap().to_string();
    let http = common::http_client();
    let secret_args = json!({"type": "t", "args": ["secret-arg-value"], "meta": {"m": "secret-meta-value"}});
    let created = http
        .post(format!("http://{address}/svc/v1/jobs"))
        .header("authorization", format!("Bearer {ADMIN}"))
        .header("content-type", "application/svc+json")
        .body(secret_args.to_string())
        .send()
        .unwrap();
    assert_eq!(created.status(), 201);
    let fetched = http
        .post(format!("http://{address}/svc/v1/workers/fetch"))
        .header("authorization", format!("Bearer {ADMIN}"))
        .header("content-type", "application/svc+json")
        .body(r#"{"queues":["default"]}"#)
        .send()
        .unwrap();
    let id = fetched.json::<Value>().unwrap()["jobs"][0]["id"].as_str().unwrap().to_string();
    let acked = http
        .post(format!("http://{address}/svc/v1/workers/ack"))
        .header("authorization", format!("Bearer {ADMIN}"))
        .header("content-type", "application/svc+json")
        .body(json!({"job_id": id, "result": {"r": "secret-result-value"}}).to_string())
        .send()
        .unwrap();
    assert_eq!(acked.status(), 200);
    let refused = http
        .get(format!("http://{address}/svc/v1/queues"))
        .header("authorization", "Bearer wrong-key-wrong-key-wrong-key-wrong")
        .send()
        .unwrap();
    assert_eq!(refused.status(), 401);
    std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    child.wait().unwrap();
    let log: Vec<String> = lines.collect();
    let requests = log.iter().filter(|line| line.contains("\"message\":\"request\"")).count();
    assert!(requests >= 4, "one debug line per request: {log:#?}");
    for line in &log {
        serde_json::from_str::<Value>(line).expect("every line is JSON");
        for secret in [ADMIN, "wrong-key", "secret-arg-value", "secret-meta-value", "secret-result-value", &id] {
            assert!(!line.contains(secret), "{secret} in the log: {line}");
        }
    }
}
