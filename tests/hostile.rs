//! Hostile requests against a real server: extreme and malformed ids, times,
//! priorities, counts, timeouts and sizes, through every write route. Each
//! answer must be a 2xx or a 4xx (never a 5xx), and after every sequence the
//! engine still takes writes and reports itself healthy. The engine checks
//! its invariants after every batch, so a broken invariant stops it too.

mod common;

use common::{TestServer, config_for};
use proptest::prelude::*;
use serde_json::{Value, json};
use std::sync::OnceLock;

/// One server for every case: state left by earlier cases makes later ones harder.
fn server() -> &'static TestServer {
    static SERVER: OnceLock<(tempfile::TempDir, TestServer)> = OnceLock::new();
    &SERVER
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let config = config_for(dir.path());
            let mut engine = svc::__private::server::engine_config(&config);
            engine.wiring.check_invariants = true;
            // Small caps, so that pruning runs while the cases do.
            engine.retention.max_terminal_jobs = 50;
            engine.retention.max_terminal_bytes = 256 * 1024;
            let server = TestServer::start_with(&config, engine);
            (dir, server)
        })
        .1
}

fn hostile_id() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => Just(json!("ffffffff-ffff-7000-8000-000000000000")),
        3 => Just(json!("ffffffff-ffff-7fff-bfff-ffffffffffff")),
        1 => Just(json!("00000000-0000-7000-8000-000000000000")),
        1 => Just(json!("00000000-0000-7fff-bfff-ffffffffffff")),
        // A valid UUIDv7 at any time, with any counter.
        2 => (any::<u64>(), any::<u64>()).prop_map(|(high, low)| {
            let value = (u128::from(high) << 64 | u128::from(low)) & !(0xf << 76) & !(0b11 << 62);
            let value = value | (0x7 << 76) | (0b10 << 62);
            json!(uuid::Uuid::from_u128(value).hyphenated().to_string())
        }),
        1 => Just(json!("019539a4-aaaa-4000-8000-000000000000")),
        1 => Just(json!("not-an-id")),
        1 => Just(json!(7)),
        1 => Just(json!(null)),
    ]
}

fn hostile_time() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!("0000-01-01T00:00:00Z")),
        Just(json!("0001-01-01T00:00:00Z")),
        Just(json!("1970-01-01T00:00:00Z")),
        Just(json!("9999-12-31T23:59:59.999Z")),
        Just(json!("2262-04-11T23:47:16.854Z")),
        Just(json!("2026-02-30T10:00:00Z")),
        Just(json!("2030-01-01T00:00:00+14:00")),
        Just(json!("2030-01-01T00:00:00-23:59")),
        Just(json!("PT1S")),
        Just(json!("P100000Y")),
        Just(json!(-1)),
        Just(json!(1e308)),
        (0i64..4_000_000_000_000).prop_map(|ms| json!(format!("{}", jiff_like(ms)))),
    ]
}

/// An RFC 3339 timestamp for Unix milliseconds, without a date library.
fn jiff_like(ms: i64) -> String {
    let seconds = ms / 1000;
    let days = seconds / 86_400;
    let (year, month, day) = civil_from_days(days);
    let rest = seconds % 86_400;
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z", rest / 3600, rest / 60 % 60, rest % 60, ms % 1000)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

fn hostile_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(0)),
        Just(json!(1)),
        Just(json!(-1)),
        Just(json!(100)),
        Just(json!(101)),
        Just(json!(-101)),
        Just(json!(86_400_000)),
        Just(json!(86_400_001)),
        Just(json!(i64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(u64::MAX)),
        Just(json!(1.5)),
        Just(json!(1e300)),
        Just(json!("5")),
        any::<i32>().prop_map(|n| json!(n)),
    ]
}

fn queue_name() -> impl Strategy<Value = String> {
    prop_oneof![Just("default".to_string()), Just("q1".to_string()), "[a-z]{1,3}", Just("x".repeat(129))]
}

/// A hostile enqueue body.
fn enqueue_body() -> impl Strategy<Value = Value> {
    // Each hostile field is rare enough that many bodies pass validation and
    // reach the engine.
    let rare = 0.15;
    (
        proptest::option::weighted(0.6, hostile_id()),
        proptest::option::weighted(rare, hostile_time()),
        proptest::option::weighted(rare, hostile_time()),
        proptest::option::weighted(rare, hostile_number()),
        proptest::option::weighted(rare, hostile_number()),
        proptest::option::weighted(rare, hostile_number()),
        queue_name(),
        0usize..3000,
        proptest::option::weighted(0.3, job_controls()),
    )
        .prop_map(|(id, scheduled_at, expires_at, priority, timeout_ms, max_attempts, queue, size, controls)| {
            let mut options = json!({"queue": queue});
            if let Some((unique, rate_limit, pending)) = controls {
                options["unique"] = unique;
                options["rate_limit"] = rate_limit;
                options["pending"] = pending;
            }
            for (key, value) in [
                ("scheduled_at", scheduled_at),
                ("expires_at", expires_at),
                ("priority", priority),
                ("timeout_ms", timeout_ms.clone()),
                ("visibility_timeout_ms", timeout_ms),
            ] {
                if let Some(value) = value {
                    options[key] = value;
                }
            }
            if let Some(attempts) = max_attempts {
                options["retry"] = json!({"max_attempts": attempts, "initial_interval": "PT0.001S"});
            }
            let mut body = json!({"type": "t.hostile", "args": ["x".repeat(size)], "options": options});
            if let Some(id) = id {
                body["id"] = id;
            }
            body
        })
}

/// A unique policy, a dispatch limit and the staging flag, each with hostile
/// values now and then.
fn job_controls() -> impl Strategy<Value = (Value, Value, Value)> {
    let unique = prop_oneof![
        Just(json!({})),
        Just(json!({"on_conflict": "replace", "key": ["0"]})),
        Just(json!({"on_conflict": "ignore", "states": ["available", "active"]})),
        hostile_number().prop_map(|period| json!({"period": period})),
        Just(json!({"key": ["x".repeat(300)]})),
    ];
    let rate_limit = prop_oneof![
        Just(json!({"concurrency": 1})),
        Just(json!({"key": "k", "rate": 100000, "period": "hour"})),
        hostile_number().prop_map(|n| json!({"max_per_second": n})),
        hostile_number().prop_map(|n| json!({"concurrency": n, "rate": n, "period": "second"})),
    ];
    let pending = prop_oneof![Just(json!(false)), Just(json!(true)), Just(json!("yes"))];
    (unique, rate_limit, pending)
}

/// One hostile request: (method, path, body).
fn request() -> impl Strategy<Value = (&'static str, String, Value)> {
    prop_oneof![
        3 => enqueue_body().prop_map(|body| ("POST", "/svc/v1/jobs".to_string(), body)),
        1 => proptest::collection::vec(enqueue_body(), 1..5).prop_map(|jobs| ("POST", "/svc/v1/jobs/batch".to_string(), json!({"jobs": jobs}))),
        3 => (proptest::collection::vec(queue_name(), 0..5), proptest::option::of(hostile_number()), proptest::option::of(hostile_number()))
            .prop_map(|(queues, count, visibility)| {
                let mut body = json!({"queues": queues, "worker_id": "w-hostile"});
                if let Some(count) = count { body["count"] = count; }
                if let Some(visibility) = visibility { body["visibility_timeout_ms"] = visibility; }
                ("POST", "/svc/v1/workers/fetch".to_string(), body)
            }),
        2 => hostile_id().prop_map(|id| ("POST", "/svc/v1/workers/ack".to_string(), json!({"job_id": id, "result": {"n": 1}}))),
        2 => (hostile_id(), any::<bool>(), proptest::option::of(any::<bool>())).prop_map(|(id, requeue, retryable)| {
            let mut error = json!({"type": "E", "message": "m"});
            if let Some(retryable) = retryable { error["retryable"] = retryable.into(); }
            ("POST", "/svc/v1/workers/nack".to_string(), json!({"job_id": id, "error": error, "requeue": requeue}))
        }),
        1 => (proptest::collection::vec(hostile_id(), 0..4), proptest::option::of(hostile_number())).prop_map(|(ids, visibility)| {
            let mut body = json!({"worker_id": "w-hostile", "active_jobs": ids});
            if let Some(visibility) = visibility { body["visibility_timeout_ms"] = visibility; }
            ("POST", "/svc/v1/workers/heartbeat".to_string(), body)
        }),
        1 => hostile_id().prop_map(|id| ("DELETE", format!("/svc/v1/jobs/{}", id.as_str().unwrap_or("x")), Value::Null)),
        1 => hostile_id().prop_map(|id| ("POST", format!("/svc/v1/jobs/{}/activate", id.as_str().unwrap_or("x")), Value::Null)),
        1 => hostile_id().prop_map(|id| ("POST", format!("/svc/v1/dead-letter/{}/retry", id.as_str().unwrap_or("x")), Value::Null)),
        1 => hostile_id().prop_map(|id| ("DELETE", format!("/svc/v1/dead-letter/{}", id.as_str().unwrap_or("x")), Value::Null)),
        1 => (prop_oneof![Just("* * * * *"), Just("0 0 31 2 *"), Just("59 23 29 2 *"), Just("*/0 * * * *")],
              prop_oneof![Just("UTC"), Just("Pacific/Kiritimati"), Just("America/Sao_Paulo"), Just("Mars/Base")])
            .prop_map(|(schedule, timezone)| {
                let body = json!({"name": "hostile", "schedule": schedule, "timezone": timezone, "job_template": {"type": "t.cron", "args": []}});
                ("POST", "/svc/v1/cron".to_string(), body)
            }),
        1 => hostile_schema().prop_map(|(uri, document)| ("POST", "/svc/v1/schemas".to_string(), json!({"uri": uri, "schema": document}))),
        1 => (hostile_schema(), enqueue_body()).prop_map(|((uri, _), mut body)| {
            body["schema"] = uri.into();
            ("POST", "/svc/v1/jobs".to_string(), body)
        }),
        1 => hostile_schema().prop_map(|(uri, _)| ("DELETE", format!("/svc/v1/schemas/{uri}"), Value::Null)),
    ]
}

/// A schema registration with a hostile document now and then: recursive
/// references, references to nothing, deep nesting, a backtracking pattern.
fn hostile_schema() -> impl Strategy<Value = (&'static str, Value)> {
    let uri = prop_oneof![Just("urn:h:1"), Just("urn:h:2"), Just("https://h.example/s.json"), Just("no-scheme")];
    let document = prop_oneof![
        Just(json!({"$ref": "#"})),
        Just(json!({"items": {"$ref": "#"}, "type": "array"})),
        Just(json!({"$ref": "urn:h:1"})),
        Just(json!({"$ref": "https://h.example/s.json#/nowhere"})),
        Just(json!({"type": "array", "items": {"type": "string", "pattern": "^(a+)+$"}})),
        (1usize..200).prop_map(|depth| {
            let mut document = json!({"type": "array"});
            for _ in 0..depth {
                document = json!({"type": "array", "items": document});
            }
            document
        }),
        Just(json!({"type": "unknown-type"})),
        Just(json!(false)),
    ];
    (uri, document)
}

fn send(server: &TestServer, method: &str, path: &str, body: &Value) -> u16 {
    let answer = match method {
        "DELETE" => server.delete(path),
        _ if body.is_null() => server.post_raw(path, "", None),
        _ => server.post(path, body.clone()),
    };
    answer.status
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn no_request_stops_the_engine(requests in proptest::collection::vec(request(), 1..25)) {
        let server = server();
        for (method, path, body) in &requests {
            let status = send(server, method, path, body);
            prop_assert!(status < 500, "{method} {path} {body} answered {status}");
        }
        let health = server.get("/svc/v1/health");
        prop_assert_eq!(health.status, 200, "{}", health.body);
        let probe = server.post("/svc/v1/jobs", json!({"type": "t.probe", "args": []}));
        prop_assert_eq!(probe.status, 201, "{}", probe.body);
    }
}

/// Reads the value of an unlabelled metric from `/metrics`.
fn metric(server: &TestServer, name: &str) -> f64 {
    let text = server.get_text("/metrics");
    let line = text.lines().find(|line| line.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// A batch that several webhook subscriptions take used to be logged as one
/// record holding every event's body once per subscription (here about
/// 170 MB, past a log frame): the log failed and the server stopped after
/// answering 503. Its deliveries are now logged in bounded records holding
/// each body once, and the server goes on.
#[test]
fn a_large_batch_fanned_out_to_subscriptions_is_logged_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let clock = svc::clock::ManualClock::new(1_800_000_000_000);
    let start = || {
        let config = config_for(dir.path());
        let mut engine = svc::__private::server::engine_config(&config);
        engine.clock = std::sync::Arc::new(clock.clone());
        TestServer::start_with(&config, engine)
    };
    let server = start();
    for n in 0..5 {
        let subscription = json!({"url": format!("https://hooks{n}.example.com/svc"), "events": ["job.enqueued"],
                                  "secret": "whk-secret-0123456789"});
        assert_eq!(server.post("/svc/v1/webhooks", subscription).status, 201);
    }
    let trace_id = "t".repeat(3000);
    let jobs: Vec<Value> =
        (0..10_000).map(|n| json!({"type": "t", "args": [n], "meta": {"trace_id": trace_id}})).collect();
    let body = serde_json::to_vec(&json!({"jobs": jobs})).unwrap();
    assert!(body.len() > 30_000_000, "{} bytes", body.len());
    let answer = server.post_raw("/svc/v1/jobs/batch", body, Some("application/svc+json"));
    assert!(answer.status < 300, "{} {}", answer.status, answer.body);
    assert_eq!(server.get("/svc/v1/health").status, 200);
    assert_eq!(metric(&server, "svc_webhook_pending"), 50_000.0);
    // Still taking writes.
    server.enqueue(json!({"type": "t", "args": []}));
    server.stop();

    let server = start();
    assert_eq!(metric(&server, "svc_webhook_pending"), 50_005.0, "every delivery survives the restart");
    let first = answer.body["jobs"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(server.job(&first)["meta"]["trace_id"], trace_id.as_str());
}

/// A client that holds sockets until the process runs out of descriptors
/// used to make the next log segment impossible to create (every snapshot
/// starts one): the log failed and the server stopped. Under a low open-file
/// limit the server now caps its connections below it, refuses the rest,
/// and snapshots and rotations go on.
#[test]
#[allow(unsafe_code)]
fn sockets_held_past_the_open_file_limit_do_not_stop_the_server() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let spawn = |limit: u64| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_svc"));
        command
            .args(["serve", "--log-format", "json", "--listen", "127.0.0.1:0", "--snapshot-log-bytes", "65536"])
            .arg("--data-dir")
            .arg(dir.path())
            .stderr(std::process::Stdio::piped());
        // SAFETY: only setrlimit, which is async-signal-safe, runs in the child.
        unsafe {
            command.pre_exec(move || {
                let rlimit = libc::rlimit { rlim_cur: limit, rlim_max: limit };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &rlimit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn().unwrap();
        let lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let (sender, receiver) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let _ = sender.send(line);
            }
        });
        let mut early = Vec::new();
        let listening = receiver
            .iter()
            .find(|line| {
                early.push(line.clone());
                line.contains("svc listening")
            })
            .expect("the server starts");
        let address = serde_json::from_str::<Value>(&listening).unwrap()["address"].as_str().unwrap().to_string();
        (child, receiver, address, early)
    };
    // This process holds the client side of every socket: its own limit up to the hard one.
    let mut own = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain calls with a valid, writable rlimit.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut own);
        own.rlim_cur = own.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &own);
    }
    let (mut child, log, address, early) = spawn(512);
    let http = common::http_client();
    let base = format!("http://{address}/svc/v1");
    let enqueue = |n: usize| {
        http.post(format!("{base}/jobs"))
            .header("content-type", "application/svc+json")
            .body(json!({"type": "t", "args": [n, "x".repeat(8000)]}).to_string())
            .send()
            .unwrap()
    };
    // The client's kept-alive connection comes first, before the others fill the cap.
    assert_eq!(enqueue(0).status(), 201);
    let held: Vec<std::net::TcpStream> = (0..700).filter_map(|_| std::net::TcpStream::connect(&address).ok()).collect();
    assert!(held.len() > 500, "{} sockets connected", held.len());
    // About 1.6 MB of log: some two dozen snapshots, each on a new segment.
    for n in 1..200 {
        let answer = enqueue(n);
        assert_eq!(answer.status(), 201, "enqueue {n}: {:?}", answer.text());
    }
    assert_eq!(http.get(format!("{base}/health")).send().unwrap().status(), 200);
    assert!(child.try_wait().unwrap().is_none(), "the server is running");
    // A new connection is refused with an answer, not left hanging.
    let refused = common::http_client().get(format!("{base}/health")).send();
    if let Ok(refused) = refused {
        assert_eq!(refused.status(), 503);
    }
    drop(held);
    let status = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    assert!(child.wait().unwrap().success(), "a clean stop");
    let lines: Vec<String> = early.into_iter().chain(log.try_iter()).collect();
    assert!(lines.iter().any(|line| line.contains("lowered to fit the open-file limit")), "{lines:?}");
    assert!(!lines.iter().any(|line| line.contains("stopping")), "{lines:?}");
    assert!(lines.iter().filter(|line| line.contains("snapshot written")).count() >= 5, "{lines:?}");

    let (mut child, _log, address, _) = spawn(4096);
    let stats: Value = common::http_client()
        .get(format!("http://{address}/svc/v1/queues/default/stats"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(stats["states"]["available"], 200, "{stats}");
}

/// Live jobs are bounded by the bytes they hold as well as by their count:
/// past `limits.max_live_bytes`, new work is refused with 503 until jobs end.
#[test]
fn live_jobs_are_bounded_by_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_for(dir.path());
    config.max_live_bytes = 200_000;
    let server = TestServer::start_with(&config, svc::__private::server::engine_config(&config));
    let big = "x".repeat(10_000);
    let mut taken = Vec::new();
    let refused = loop {
        let answer = server.post("/svc/v1/jobs", json!({"type": "t", "args": [big], "queue": "big"}));
        if answer.status != 201 {
            break answer;
        }
        taken.push(answer.body["job"]["id"].as_str().unwrap().to_string());
        assert!(taken.len() < 100, "200 kB of live jobs hold fewer than 100 jobs of 10 kB");
    };
    assert!(taken.len() >= 15, "{} jobs taken", taken.len());
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(refused.body["error"]["details"]["reason"], "capacity", "{}", refused.body);
    assert_eq!(refused.body["error"]["retryable"], true);
    // Jobs that end make room again.
    for id in &taken[..5] {
        assert_eq!(server.delete(&format!("/svc/v1/jobs/{id}")).status, 200);
    }
    assert_eq!(server.post("/svc/v1/jobs", json!({"type": "t", "args": [big], "queue": "big"})).status, 201);
}
