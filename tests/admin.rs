//! The admin API against a real server: totals, queues with their counts
//! and backpressure (durable, refusing past the bound, a batch as a whole),
//! listing and searching jobs page by page, one job with its timeline, bulk
//! actions by filter, workers, and the dead letter listing paged by number.
//! The job listing, a job's timeline and the bulk actions run on the
//! PostgreSQL backend too.

mod common;

use common::PostgresNode;
use common::TestServer;
use serde_json::{Value, json};

fn server() -> (tempfile::TempDir, TestServer) {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    (dir, server)
}

/// A node on a PostgreSQL server of the test's own.
fn server_on_postgres() -> PostgresNode {
    PostgresNode::start("admin")
}

/// Enqueues a job into `queue` that fails for good on its first attempt.
fn discarded(server: &TestServer, queue: &str, marker: &str) -> String {
    let id = server.enqueue(json!({
        "type": "report.build",
        "args": [{"marker": marker}],
        "options": {"queue": queue, "retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"}},
    }));
    assert_eq!(server.fetch(&[queue], 1)[0]["id"], id.as_str());
    let nack = json!({"job_id": id, "error": {"type": "Boom", "message": format!("failed on {marker}")}});
    assert_eq!(server.post("/svc/v1/workers/nack", nack).status, 200);
    id
}

#[test]
fn stats_and_queues_show_counts_per_state() {
    let (_dir, server) = server();
    check_stats_and_queues_show_counts_per_state(&server);
}

#[test]
fn on_postgres_stats_and_queues_show_counts_per_state() {
    let server = server_on_postgres();
    check_stats_and_queues_show_counts_per_state(&server);
}

fn check_stats_and_queues_show_counts_per_state(server: &TestServer) {
    server.enqueue(json!({"type": "t", "args": [1], "options": {"queue": "mail"}}));
    server.enqueue(json!({"type": "t", "args": [2], "options": {"queue": "mail"}}));
    server.fetch(&["mail"], 1);
    discarded(server, "reports", "a");

    let stats = server.get("/svc/v1/admin/stats");
    assert_eq!(stats.status, 200, "{}", stats.body);
    assert_eq!(stats.body["jobs"]["available"], 1);
    assert_eq!(stats.body["jobs"]["active"], 1);
    assert_eq!(stats.body["jobs"]["discarded"], 1);
    assert_eq!(stats.body["dead_letter"], 1);
    assert_eq!(stats.body["throughput"]["failed_per_minute"], 1);
    // `default` always exists; mail and reports hold jobs.
    assert_eq!(stats.body["queues"], 3);

    let queues = server.get("/svc/v1/admin/queues?per_page=2");
    assert_eq!(queues.status, 200, "{}", queues.body);
    let names: Vec<&str> =
        queues.body["items"].as_array().unwrap().iter().map(|q| q["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["default", "mail"]);
    assert_eq!(queues.body["items"][1]["counts"]["active"], 1);
    assert_eq!(queues.body["items"][1]["depth"], 1);
    assert_eq!(queues.body["pagination"]["total"], 3);
    assert_eq!(queues.body["pagination"]["has_more"], true);
    let second = server.get("/svc/v1/admin/queues?per_page=2&page=2");
    assert_eq!(second.body["items"][0]["name"], "reports");
    assert_eq!(second.body["pagination"]["page"], 2);
    let cursor = queues.body["pagination"]["next_cursor"].as_str().unwrap();
    let by_cursor = server.get(&format!("/svc/v1/admin/queues?limit=2&cursor={cursor}"));
    assert_eq!(by_cursor.body["items"], second.body["items"]);

    let paused = server.post_raw("/svc/v1/admin/queues/mail/pause", "", None);
    assert_eq!((paused.status, &paused.body["paused"]), (200, &json!(true)), "{}", paused.body);
    assert_eq!(server.get("/svc/v1/admin/queues/mail").body["queue"]["paused"], true);
    let resumed = server.post_raw("/svc/v1/admin/queues/mail/resume", "", None);
    assert_eq!(resumed.body["paused"], false);
    assert_eq!(server.get("/svc/v1/admin/queues/nowhere").status, 404);
    assert_eq!(server.get("/svc/v1/admin/queues?page=0").error_code(), "invalid_request");
    assert_eq!(server.get("/svc/v1/admin/queues?page=200&per_page=100").error_code(), "invalid_request");

    // A queue that holds nothing any more is not shown, as if never used.
    assert_eq!(server.get("/svc/v1/queues/reports/stats").status, 200);
    let deleted =
        server.post("/svc/v1/admin/jobs/bulk/delete", json!({"filter": {"queue": "reports"}, "confirm": true}));
    assert_eq!(deleted.body["changed"], 1, "{}", deleted.body);
    assert_eq!(server.get("/svc/v1/queues/reports/stats").status, 404);
    assert_eq!(server.get("/svc/v1/admin/queues/reports").status, 404);
    assert_eq!(server.get("/svc/v1/admin/queues").body["pagination"]["total"], 2);
}

#[test]
fn backpressure_refuses_past_the_bound_warns_before_it_and_survives_a_restart() {
    let (dir, server) = server();
    let config = json!({"backpressure": {"max_depth": 4, "strategy": "reject", "warning_threshold": 0.5}});
    let set = server.put("/svc/v1/admin/queues/bounded/config", config);
    assert_eq!(set.status, 200, "{}", set.body);
    assert_eq!(set.body["backpressure"]["max_depth"], 4);

    let job = |n: u64| json!({"type": "t", "args": [n], "options": {"queue": "bounded"}});
    let first = server.post("/svc/v1/jobs", job(1));
    assert_eq!(first.status, 201);
    assert_eq!(first.header("x-svc-queue-pressure"), None, "below the warning threshold");
    let second = server.post("/svc/v1/jobs", job(2));
    assert_eq!(second.header("x-svc-queue-pressure"), Some("0.50"));

    // Two waiting, room for two: a batch of three is refused whole.
    let batch = server.post("/svc/v1/jobs/batch", json!({"jobs": [job(3), job(4), job(5)]}));
    assert_eq!((batch.status, batch.error_code()), (429, "queue_full"), "{}", batch.body);
    assert_eq!(batch.body["error"]["details"]["index"], 2);
    assert_eq!(server.get("/svc/v1/admin/queues/bounded").body["queue"]["depth"], 2, "nothing of the batch stored");
    assert_eq!(server.post("/svc/v1/jobs/batch", json!({"jobs": [job(3), job(4)]})).status, 201);

    let refused = server.post("/svc/v1/jobs", job(6));
    assert_eq!((refused.status, refused.error_code()), (429, "queue_full"));
    assert_eq!(refused.body["error"]["retryable"], true);
    assert_eq!(refused.header("x-svc-queue-depth"), Some("4"));
    assert_eq!(refused.header("x-svc-queue-bound"), Some("4"));
    assert!(refused.header("retry-after").is_some());
    // Other queues are not bound.
    server.enqueue(json!({"type": "t", "args": [], "options": {"queue": "free"}}));

    // A claimed job no longer waits: room for one more.
    server.fetch(&["bounded"], 1);
    assert_eq!(server.post("/svc/v1/jobs", job(7)).status, 201);
    assert_eq!(server.post("/svc/v1/jobs", job(8)).status, 429);

    server.stop();
    let server = TestServer::start(dir.path());
    let config = server.get("/svc/v1/admin/queues/bounded/config");
    assert_eq!(config.body["backpressure"]["max_depth"], 4, "the bound is durable");
    assert_eq!(server.post("/svc/v1/jobs", job(9)).status, 429);

    let removed = server.put("/svc/v1/admin/queues/bounded/config", json!({"backpressure": null}));
    assert_eq!(removed.body["backpressure"], Value::Null);
    assert_eq!(server.post("/svc/v1/jobs", job(10)).status, 201);

    let bad = server.put("/svc/v1/admin/queues/bounded/config", json!({"backpressure": {"max_depth": 0}}));
    assert_eq!((bad.status, bad.body["error"]["details"]["field"].as_str()), (400, Some("backpressure.max_depth")));
    let bad =
        server.put("/svc/v1/admin/queues/x/config", json!({"backpressure": {"max_depth": 3, "strategy": "drop"}}));
    assert_eq!(bad.status, 400);
}

#[test]
fn jobs_are_listed_filtered_searched_and_paged_without_repeats() {
    let (_dir, server) = server();
    check_jobs_are_listed_filtered_searched_and_paged_without_repeats(&server);
}

#[test]
fn on_postgres_jobs_are_listed_filtered_searched_and_paged_without_repeats() {
    let server = server_on_postgres();
    check_jobs_are_listed_filtered_searched_and_paged_without_repeats(&server);
}

fn check_jobs_are_listed_filtered_searched_and_paged_without_repeats(server: &TestServer) {
    let mut emails = Vec::new();
    for n in 0..30 {
        emails.push(server.enqueue(json!({"type": "email.send", "args": [{"to": format!("user{n}@example.com")}], "options": {"queue": "mail"}})));
    }
    server.enqueue(json!({"type": "sms.send", "args": [{"to": "+100"}], "options": {"queue": "mail"}}));
    let failed = discarded(server, "reports", "needle-in-error");

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(cursor) => format!("/svc/v1/admin/jobs?type=email.*&limit=7&cursor={cursor}"),
            None => "/svc/v1/admin/jobs?type=email.*&limit=7".to_string(),
        };
        let page = server.get(&path);
        assert_eq!(page.status, 200, "{}", page.body);
        for job in page.body["items"].as_array().unwrap() {
            assert_eq!(job["type"], "email.send");
            seen.push(job["id"].as_str().unwrap().to_string());
        }
        match page.body["pagination"]["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    let mut expected = emails.clone();
    expected.sort();
    seen.sort();
    assert_eq!(seen, expected, "every email job once");

    let found = server.get("/svc/v1/admin/jobs?q=user17%40example.com");
    let items = found.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{}", found.body);
    assert_eq!(items[0]["id"], emails[17].as_str());

    let by_error = server.get("/svc/v1/admin/jobs?q=needle-in-error&state=discarded");
    assert_eq!(by_error.body["items"][0]["id"], failed.as_str());
    assert_eq!(
        server.get("/svc/v1/admin/jobs?state=discarded,available&queue=reports").body["items"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(server.get("/svc/v1/admin/jobs?since=2999-01-01T00:00:00Z").body["items"], json!([]));

    assert_eq!(server.get("/svc/v1/admin/jobs?state=sleeping").error_code(), "invalid_request");
    assert_eq!(server.get("/svc/v1/admin/jobs?cursor=bm9wZQ").error_code(), "invalid_request");
    assert_eq!(server.get("/svc/v1/admin/jobs?since=yesterday").error_code(), "invalid_request");
}

#[test]
fn a_job_in_full_carries_its_timeline() {
    let (_dir, server) = server();
    check_a_job_in_full_carries_its_timeline(&server);
}

#[test]
fn on_postgres_a_job_in_full_carries_its_timeline() {
    let server = server_on_postgres();
    check_a_job_in_full_carries_its_timeline(&server);
}

fn check_a_job_in_full_carries_its_timeline(server: &TestServer) {
    let id = discarded(server, "reports", "x");
    let detail = server.get(&format!("/svc/v1/admin/jobs/{id}"));
    assert_eq!(detail.status, 200, "{}", detail.body);
    assert_eq!((detail.body["id"].as_str(), detail.body["queue"].as_str()), (Some(id.as_str()), Some("reports")));
    let events: Vec<&str> =
        detail.body["timeline"].as_array().unwrap().iter().map(|entry| entry["event"].as_str().unwrap()).collect();
    assert_eq!(events, ["created", "started", "failed", "discarded"], "{}", detail.body);
    assert_eq!(detail.body["timeline"][2]["message"], "failed on x");
    assert_eq!(server.get("/svc/v1/admin/jobs/019a0000-0000-7000-8000-000000000000").status, 404);
    assert_eq!(server.get("/svc/v1/admin/jobs/nope").status, 404);
}

#[test]
fn bulk_actions_need_confirmation_count_in_a_dry_run_and_act_by_filter() {
    let (_dir, server) = server();
    check_bulk_actions_need_confirmation_count_in_a_dry_run_and_act_by_filter(&server);
}

#[test]
fn on_postgres_bulk_actions_need_confirmation_count_in_a_dry_run_and_act_by_filter() {
    let server = server_on_postgres();
    check_bulk_actions_need_confirmation_count_in_a_dry_run_and_act_by_filter(&server);
}

fn check_bulk_actions_need_confirmation_count_in_a_dry_run_and_act_by_filter(server: &TestServer) {
    let failed: Vec<String> = (0..3).map(|n| discarded(server, "reports", &n.to_string())).collect();
    let waiting: Vec<String> =
        (0..4).map(|n| server.enqueue(json!({"type": "t", "args": [n], "options": {"queue": "mail"}}))).collect();

    let unconfirmed =
        server.post("/svc/v1/admin/jobs/bulk/retry", json!({"filter": {"state": "discarded"}, "confirm": false}));
    assert_eq!((unconfirmed.status, unconfirmed.error_code()), (400, "invalid_request"));
    assert_eq!(server.get(&format!("/svc/v1/jobs/{}", failed[0])).body["job"]["state"], "discarded", "nothing changed");

    let dry = server.post("/svc/v1/admin/jobs/bulk/retry", json!({"filter": {"queue": "reports"}, "dry_run": true}));
    assert_eq!((dry.status, &dry.body["matched"], &dry.body["changed"]), (200, &json!(3), &json!(0)), "{}", dry.body);

    let retried =
        server.post("/svc/v1/admin/jobs/bulk/retry", json!({"filter": {"queue": "reports"}, "confirm": true}));
    assert_eq!((&retried.body["matched"], &retried.body["changed"]), (&json!(3), &json!(3)), "{}", retried.body);
    for id in &failed {
        assert_eq!(server.job(id)["state"], "available");
    }

    let cancelled =
        server.post("/svc/v1/admin/jobs/bulk/cancel", json!({"filter": {"queue": "mail"}, "confirm": true}));
    assert_eq!(cancelled.body["changed"], 4);
    let deleted =
        server.post("/svc/v1/admin/jobs/bulk/delete", json!({"filter": {"state": ["cancelled"]}, "confirm": true}));
    assert_eq!(deleted.body["changed"], 4);
    for id in &waiting {
        assert_eq!(server.get(&format!("/svc/v1/jobs/{id}")).status, 404);
    }
    // Delete leaves jobs that have not ended alone.
    let none = server.post("/svc/v1/admin/jobs/bulk/delete", json!({"filter": {"queue": "reports"}, "confirm": true}));
    assert_eq!(none.body["matched"], 0);
    assert_eq!(server.job(&failed[0])["state"], "available");

    // A queue's purge by state: waiting jobs are cancelled, then removed.
    let later: Vec<String> = (0..2)
        .map(|n| {
            server.enqueue(
                json!({"type": "t", "args": [n], "options": {"queue": "mail", "delay_until": "2099-01-01T00:00:00Z"}}),
            )
        })
        .collect();
    let kept = server.enqueue(json!({"type": "t", "args": [], "options": {"queue": "mail"}}));
    let purge = json!({"filter": {"queue": "mail", "state": "scheduled"}, "confirm": true});
    let purged = server.post("/svc/v1/admin/jobs/bulk/purge", purge);
    assert_eq!((&purged.body["action"], &purged.body["changed"]), (&json!("purge"), &json!(2)), "{}", purged.body);
    for id in &later {
        assert_eq!(server.get(&format!("/svc/v1/jobs/{id}")).status, 404);
    }
    assert_eq!(server.job(&kept)["state"], "available", "other states stay");

    assert_eq!(server.post("/svc/v1/admin/jobs/bulk/explode", json!({"confirm": true})).status, 404);
    let typo = server.post("/svc/v1/admin/jobs/bulk/cancel", json!({"filter": {"queu": "mail"}, "confirm": true}));
    assert_eq!(typo.body["error"]["details"]["field"], "filter.queu");
}

#[test]
fn the_dead_letter_listing_pages_by_number_and_deletes_with_204() {
    let (_dir, server) = server();
    check_the_dead_letter_listing_pages_by_number_and_deletes_with_204(&server);
}

#[test]
fn on_postgres_the_dead_letter_listing_pages_by_number_and_deletes_with_204() {
    let server = server_on_postgres();
    check_the_dead_letter_listing_pages_by_number_and_deletes_with_204(&server);
}

fn check_the_dead_letter_listing_pages_by_number_and_deletes_with_204(server: &TestServer) {
    let ids: Vec<String> = (0..5).map(|n| discarded(server, if n < 3 { "a" } else { "b" }, &n.to_string())).collect();

    let page = server.get("/svc/v1/admin/dead-letter?per_page=2&page=2");
    assert_eq!(page.status, 200, "{}", page.body);
    assert_eq!(page.body["pagination"]["total"], 5);
    assert_eq!(page.body["pagination"]["page"], 2);
    // Newest first: the third and second newest.
    assert_eq!(page.body["items"][0]["id"], ids[2].as_str());
    assert_eq!(page.body["items"][1]["id"], ids[1].as_str());
    assert_eq!(server.get("/svc/v1/admin/dead-letter?queue=b").body["pagination"]["total"], 2);
    assert_eq!(server.get("/svc/v1/admin/dead-letter/stats").body["total"], 5);

    let retried = server.post_raw(&format!("/svc/v1/admin/dead-letter/{}/retry", ids[0]), "", None);
    assert_eq!((retried.status, &retried.body["job"]["state"]), (200, &json!("available")));
    let deleted = server.delete(&format!("/svc/v1/admin/dead-letter/{}", ids[1]));
    assert_eq!((deleted.status, &deleted.body), (204, &Value::Null));
    assert_eq!(server.get(&format!("/svc/v1/jobs/{}", ids[1])).status, 404);
    assert_eq!(server.get("/svc/v1/admin/dead-letter/stats").body["total"], 3);
    assert_eq!(server.delete(&format!("/svc/v1/admin/dead-letter/{}", ids[1])).status, 404);
}

#[test]
fn workers_are_listed_with_totals_and_can_be_signalled() {
    let (_dir, server) = server();
    check_workers_are_listed_with_totals_and_can_be_signalled(&server);
}

#[test]
fn on_postgres_workers_are_listed_with_totals_and_can_be_signalled() {
    let server = server_on_postgres();
    check_workers_are_listed_with_totals_and_can_be_signalled(&server);
}

fn check_workers_are_listed_with_totals_and_can_be_signalled(server: &TestServer) {
    for worker in ["w-1", "w-2"] {
        let fetch = json!({"queues": ["default"], "count": 1, "worker_id": worker});
        assert_eq!(server.post("/svc/v1/workers/fetch", fetch).status, 200);
    }
    let quiet = server.post_raw("/svc/v1/admin/workers/w-2/quiet", "", None);
    assert_eq!((quiet.status, &quiet.body["worker"]["state"]), (200, &json!("quiet")), "{}", quiet.body);
    let workers = server.get("/svc/v1/admin/workers");
    assert_eq!(workers.status, 200, "{}", workers.body);
    assert_eq!(workers.body["summary"], json!({"total": 2, "running": 1, "quiet": 1, "terminate": 0}));
    assert_eq!(workers.body["pagination"]["total"], 2);
    assert_eq!(workers.body["items"][0]["worker_id"], "w-1");
    assert_eq!(workers.body["items"][0]["queues"], json!(["default"]), "the queues its fetch named");
}

/// Reads a server-sent event stream over a plain socket.
struct Stream {
    reader: std::io::BufReader<std::net::TcpStream>,
}

impl Stream {
    fn open(server: &TestServer, path_and_query: &str, last_event_id: Option<&str>) -> Stream {
        use std::io::Write;
        let address = server.base().trim_start_matches("http://").to_string();
        let mut socket = std::net::TcpStream::connect(&address).unwrap();
        socket.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        let resume = last_event_id.map(|id| format!("Last-Event-ID: {id}\r\n")).unwrap_or_default();
        write!(socket, "GET {path_and_query} HTTP/1.1\r\nHost: {address}\r\n{resume}\r\n").unwrap();
        let mut stream = Stream { reader: std::io::BufReader::new(socket) };
        let status = stream.line();
        assert!(status.contains(" 200 "), "{status}");
        let mut headers = Vec::new();
        loop {
            let line = stream.line();
            if line.is_empty() {
                break;
            }
            headers.push(line.to_ascii_lowercase());
        }
        assert!(headers.iter().any(|h| h == "content-type: text/event-stream"), "{headers:?}");
        stream
    }

    fn line(&mut self) -> String {
        use std::io::BufRead;
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("the stream goes on");
        line.trim_end_matches(['\r', '\n']).to_string()
    }

    /// The events' data that arrive within `wait`.
    fn sent_within(&mut self, wait: std::time::Duration) -> Vec<Value> {
        use std::io::BufRead;
        self.reader.get_ref().set_read_timeout(Some(wait)).unwrap();
        let deadline = std::time::Instant::now() + wait;
        let mut sent = Vec::new();
        while std::time::Instant::now() < deadline {
            let mut line = String::new();
            match self.reader.read_line(&mut line) {
                Ok(0) => panic!("the stream ended"),
                Ok(_) => {
                    sent.extend(line.trim_end().strip_prefix("data: ").map(|data| serde_json::from_str(data).unwrap()))
                }
                Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    break;
                }
                Err(error) => panic!("{error}"),
            }
        }
        self.reader.get_ref().set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        sent
    }

    /// The next event: (id, type, data), skipping comments and chunk sizes.
    fn next_event(&mut self) -> (String, String, Value) {
        let (mut id, mut kind) = (String::new(), String::new());
        loop {
            let line = self.line();
            if let Some(value) = line.strip_prefix("id: ") {
                id = value.to_string();
            } else if let Some(value) = line.strip_prefix("event: ") {
                kind = value.to_string();
            } else if let Some(data) = line.strip_prefix("data: ") {
                return (id, kind, serde_json::from_str(data).unwrap());
            }
        }
    }
}

#[test]
fn live_events_stream_as_they_happen_filtered_and_resumable() {
    let (_dir, server) = server();
    check_live_events_stream_as_they_happen_filtered_and_resumable(&server);
}

#[test]
fn on_postgres_live_events_stream_as_they_happen_filtered_and_resumable() {
    let server = server_on_postgres();
    check_live_events_stream_as_they_happen_filtered_and_resumable(&server);
}

fn check_live_events_stream_as_they_happen_filtered_and_resumable(server: &TestServer) {
    let before = server.enqueue(json!({"type": "t", "args": ["before the stream"], "options": {"queue": "mail"}}));
    let mut stream = Stream::open(server, "/svc/v1/events/stream?types=job.enqueued&queues=mail", None);
    server.enqueue(json!({"type": "t", "args": ["elsewhere"], "options": {"queue": "other"}}));
    let first = server.enqueue(json!({"type": "t", "args": [1], "options": {"queue": "mail"}}));
    let (first_event, kind, data) = stream.next_event();
    assert_eq!(kind, "job.enqueued");
    assert_eq!(data["type"], "job.enqueued", "the data is the event's envelope: {data}");
    assert!(data.to_string().contains(&first), "the first event after opening is this job's: {data}");
    drop(stream);

    let second = server.enqueue(json!({"type": "t", "args": [2], "options": {"queue": "mail"}}));
    let mut resumed = Stream::open(server, "/svc/v1/events/stream?types=job.enqueued&queues=mail", Some(&first_event));
    let (_, _, data) = resumed.next_event();
    assert!(data.to_string().contains(&second), "resumed after the last event seen: {data}");
    drop(resumed);

    // After an event older than every one held: a gap, then the oldest.
    let long_gone = "evt_00000000-0001-7000-8000-000000000000";
    let mut resumed = Stream::open(server, "/svc/v1/events/stream?types=job.enqueued&queues=mail", Some(long_gone));
    let (_, kind, data) = resumed.next_event();
    assert_eq!(kind, "gap", "{data}");
    let (_, _, data) = resumed.next_event();
    assert!(data.to_string().contains(&before), "then the oldest event held: {data}");

    // Resumed in the middle of a batch's events (on PostgreSQL, one row).
    let job = |n: u32| json!({"type": "t", "args": [n], "options": {"queue": "mail"}});
    drop(resumed);
    let mut live = Stream::open(server, "/svc/v1/events/stream?types=job.enqueued&queues=mail", None);
    let batch = server.post("/svc/v1/jobs/batch", json!({"jobs": [job(3), job(4), job(5)]}));
    assert_eq!(batch.status, 201);
    let ids: Vec<String> = (0..3).map(|n| batch.body["jobs"][n]["id"].as_str().unwrap().to_string()).collect();
    let (third_event, _, data) = live.next_event();
    assert!(data.to_string().contains(&ids[0]), "{data}");
    drop(live);
    let mut resumed = Stream::open(server, "/svc/v1/events/stream?types=job.enqueued&queues=mail", Some(&third_event));
    for id in &ids[1..] {
        let (_, _, data) = resumed.next_event();
        assert!(data.to_string().contains(id.as_str()), "the batch's next job, {id}: {data}");
    }
}

#[test]
fn a_stream_sends_each_event_once_while_producers_race() {
    let (_dir, server) = server();
    check_a_stream_sends_each_event_once_while_producers_race(&server);
}

#[test]
fn on_postgres_a_stream_sends_each_event_once_while_producers_race() {
    let server = server_on_postgres();
    check_a_stream_sends_each_event_once_while_producers_race(&server);
}

/// Producers at once, whose enqueues a node merges into statements that
/// may commit in any order: a stream sends each job's event, once.
fn check_a_stream_sends_each_event_once_while_producers_race(server: &TestServer) {
    let mut stream = Stream::open(server, "/svc/v1/events/stream?types=job.enqueued", None);
    let mut enqueued: Vec<String> = std::thread::scope(|scope| {
        let producers: Vec<_> = (0..8)
            .map(|producer| {
                scope.spawn(move || {
                    (0..50).map(|n| server.enqueue(json!({"type": "t", "args": [producer, n]}))).collect::<Vec<_>>()
                })
            })
            .collect();
        producers.into_iter().flat_map(|producer| producer.join().unwrap()).collect()
    });
    let mut sent = Vec::new();
    while sent.len() < enqueued.len() {
        let (_, _, data) = stream.next_event();
        sent.push(data["data"]["job_id"].as_str().unwrap().to_string());
    }
    let again = stream.sent_within(std::time::Duration::from_millis(500));
    assert!(again.is_empty(), "nothing more: {again:?}");
    enqueued.sort();
    sent.sort();
    assert_eq!(sent, enqueued, "each job's event, once");
}

/// On PostgreSQL an event's id is made before its transaction commits. A
/// transaction that began before a later one, and commits after it with a
/// lower event id, is still streamed, first.
#[test]
fn on_postgres_a_stream_sends_an_event_that_commits_late_in_the_order_of_transactions() {
    let server = server_on_postgres();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (session, connection) = runtime.block_on(tokio_postgres::connect(&server.url, tokio_postgres::NoTls)).unwrap();
    runtime.spawn(connection);
    server.enqueue(json!({"type": "t", "args": ["copied"], "options": {"queue": "mail"}}));
    let mut stream = Stream::open(&server, "/svc/v1/events/stream?types=job.enqueued&queues=mail", None);

    // The transaction ids to come cross a power of ten (as 999 to 1000),
    // where their text sorts otherwise than they do: the next is one below.
    runtime.block_on(async {
        let next = || async {
            let row = session.query_one("SELECT pg_current_xact_id()::text", &[]).await.unwrap();
            row.get::<_, String>(0).parse::<u64>().unwrap()
        };
        let mut current = next().await;
        let power = 10u64.pow((current + 3).to_string().len() as u32);
        while current < power - 2 {
            current = next().await;
        }
    });
    // A transaction under way, as a merged statement or another node's: it
    // has its transaction id, and will write an event later.
    runtime.block_on(session.batch_execute("BEGIN; SELECT pg_current_xact_id()")).unwrap();
    let later = server.enqueue(json!({"type": "t", "args": ["later"], "options": {"queue": "mail"}}));
    let meanwhile = stream.sent_within(std::time::Duration::from_secs(1));
    assert!(
        meanwhile.is_empty(),
        "nothing is sent while a transaction that began before may still write: {meanwhile:?}"
    );
    // Its event: a copy of the first job's, with an id just below the later
    // job's event, so that a stream by id would have passed it.
    let late_id = runtime.block_on(async {
        let row = session
            .query_one("SELECT id::text AS id_text FROM svc_events ORDER BY id DESC LIMIT 1", &[])
            .await
            .unwrap();
        let newest: String = row.get(0);
        let late = format!("{}{:012x}", &newest[..24], u64::from_str_radix(&newest[24..], 16).unwrap() - 1);
        session
            .execute(
                "INSERT INTO svc_events (id, at, type, queue, job_type, body, members) \
                 SELECT $1::text::uuid, at, type, queue, job_type, body, members FROM svc_events \
                 ORDER BY id LIMIT 1",
                &[&late],
            )
            .await
            .unwrap();
        session.batch_execute("COMMIT").await.unwrap();
        format!("evt_{late}")
    });

    let (first, _, _) = stream.next_event();
    assert_eq!(first, late_id, "the event that committed late comes first, as its transaction began first");
    let (_, _, data) = stream.next_event();
    assert!(data.to_string().contains(&later), "then the later job's: {data}");
}

/// A client that lists events (`GET /events`) and then streams from the
/// last one listed misses none after it, even of a transaction that began
/// before that one's and committed after the listing.
#[test]
fn on_postgres_a_stream_resumed_after_a_listed_event_misses_none_after_it() {
    let server = server_on_postgres();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (session, connection) = runtime.block_on(tokio_postgres::connect(&server.url, tokio_postgres::NoTls)).unwrap();
    runtime.spawn(connection);
    runtime.block_on(session.batch_execute("BEGIN; SELECT pg_current_xact_id()")).unwrap();
    let listed = server.enqueue(json!({"type": "t", "args": ["listed"], "options": {"queue": "mail"}}));
    let page = server.get("/svc/v1/events?types=job.enqueued&queues=mail");
    let last = page.body["events"].as_array().unwrap().last().unwrap().clone();
    assert!(last.to_string().contains(&listed), "{last}");
    let last_id = last["id"].as_str().unwrap().to_string();
    // The earlier transaction writes an event after the one listed, and
    // commits once the listing is done.
    let after_id = runtime.block_on(async {
        let uuid = last_id.trim_start_matches("evt_");
        let after = format!("{}{:012x}", &uuid[..24], u64::from_str_radix(&uuid[24..], 16).unwrap() + 1);
        session
            .execute(
                "INSERT INTO svc_events (id, at, type, queue, job_type, body, members) \
                 SELECT $1::text::uuid, at, type, queue, job_type, body, members FROM svc_events \
                 WHERE id = $2::text::uuid",
                &[&after, &uuid],
            )
            .await
            .unwrap();
        session.batch_execute("COMMIT").await.unwrap();
        format!("evt_{after}")
    });

    let mut stream = Stream::open(&server, "/svc/v1/events/stream?types=job.enqueued&queues=mail", Some(&last_id));
    assert_eq!(stream.next_event().0, after_id, "the event after the one listed");
    let next = server.enqueue(json!({"type": "t", "args": ["next"], "options": {"queue": "mail"}}));
    let (_, _, data) = stream.next_event();
    assert!(data.to_string().contains(&next), "then the next job's, the listed one not again: {data}");
}

#[test]
fn throughput_per_minute_is_kept_across_a_restart() {
    let (dir, server) = server();
    let job = server.enqueue(json!({"type": "t", "args": [], "options": {"queue": "mail"}}));
    server.fetch(&["mail"], 1);
    assert_eq!(server.post("/svc/v1/workers/ack", json!({"job_id": job})).status, 200);
    discarded(&server, "mail", "x");
    let minutes =
        |server: &TestServer, path: &str, pointer: &str| server.get(path).body.pointer(pointer).cloned().unwrap();
    let before = minutes(&server, "/svc/v1/admin/stats", "/throughput/per_minute");
    let total =
        |minutes: &Value, key: &str| minutes.as_array().unwrap().iter().map(|m| m[key].as_u64().unwrap()).sum::<u64>();
    assert_eq!((total(&before, "completed"), total(&before, "failed")), (1, 1), "{before}");
    server.stop();
    assert!(dir.path().join("throughput.json").exists());

    let server = TestServer::start(dir.path());
    let after = minutes(&server, "/svc/v1/admin/stats", "/throughput/per_minute");
    assert_eq!(after, before, "the minutes come back after a restart");
    let queue = minutes(&server, "/svc/v1/admin/queues/mail", "/queue/throughput/per_minute");
    assert_eq!(total(&queue, "completed"), 1);
}

#[test]
fn a_queue_says_how_long_its_oldest_available_job_has_waited() {
    let dir = tempfile::tempdir().unwrap();
    let clock = svc::clock::ManualClock::new(1_800_000_000_000);
    let server = TestServer::start_at(dir.path(), &clock);
    server.enqueue(json!({"type": "t", "args": [1], "options": {"queue": "mail", "priority": 1}}));
    server.advance(&clock, 4_000);
    // Later but of a higher priority: fetched first, not the oldest.
    server.enqueue(json!({"type": "t", "args": [2], "options": {"queue": "mail", "priority": 9}}));
    server.advance(&clock, 1_000);
    let queue = server.get("/svc/v1/admin/queues/mail").body["queue"].clone();
    assert_eq!(queue["oldest_available_age_ms"], 5_000, "{queue}");
    assert_eq!(queue["oldest_available_at"], "2027-01-15T08:00:00Z");
    server.fetch(&["mail"], 2);
    let queue = server.get("/svc/v1/admin/queues/mail").body["queue"].clone();
    assert_eq!(queue["oldest_available_age_ms"], Value::Null, "none available");
}
