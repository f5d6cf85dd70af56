//! Acks that fetch the next jobs, and acks of several jobs: a busy
//! worker's one durable round trip (docs/api.md, "Ack").

mod common;

use common::TestServer;
use serde_json::{Value, json};

fn server() -> (tempfile::TempDir, TestServer) {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    (dir, server)
}

fn claim(server: &TestServer, queue: &str, count: u64) -> Vec<String> {
    let fetched = server.post("/svc/v1/workers/fetch", json!({"queues": [queue], "count": count, "worker_id": "w1"}));
    assert_eq!(fetched.status, 200, "{}", fetched.body);
    fetched.body["jobs"].as_array().unwrap().iter().map(|job| job["id"].as_str().unwrap().to_string()).collect()
}

fn ids(jobs: &Value) -> Vec<String> {
    jobs.as_array().unwrap().iter().map(|job| job["id"].as_str().unwrap().to_string()).collect()
}

#[test]
fn an_ack_with_fetch_completes_the_job_and_claims_the_next_for_the_same_worker() {
    let (_dir, server) = server();
    let first = server.enqueue(json!({"type": "t", "args": [1], "options": {"queue": "q"}}));
    let second = server.enqueue(json!({"type": "t", "args": [2], "options": {"queue": "q"}}));
    let third = server.enqueue(json!({"type": "t", "args": [3], "options": {"queue": "q"}}));
    assert_eq!(claim(&server, "q", 1), std::slice::from_ref(&first));

    let body = json!({"job_id": first, "result": {"n": 1}, "worker_id": "w1", "fetch": {"queues": ["q"], "count": 2}});
    let answer = server.post("/svc/v1/workers/ack", body);
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!((&answer.body["acknowledged"], &answer.body["state"]), (&json!(true), &json!("completed")));
    assert_eq!(answer.body["job"]["result"], json!({"n": 1}));
    assert_eq!(ids(&answer.body["jobs"]), [second.clone(), third.clone()]);
    for id in [&second, &third] {
        let job = server.job(id);
        assert_eq!((&job["state"], &job["worker_id"]), (&json!("active"), &json!("w1")));
    }

    // By path, with a fetch that finds nothing: an empty list.
    let answer = server.post(&format!("/svc/v1/jobs/{second}/ack"), json!({"fetch": {"queues": ["empty"]}}));
    assert_eq!((answer.status, answer.body["jobs"].as_array().map(Vec::len)), (200, Some(0)), "{}", answer.body);
    assert_eq!(server.job(&second)["state"], "completed");
}

#[test]
fn a_refused_ack_claims_nothing() {
    let (_dir, server) = server();
    let waiting = server.enqueue(json!({"type": "t", "args": [], "options": {"queue": "q"}}));
    let answer = server.post("/svc/v1/workers/ack", json!({"job_id": waiting, "fetch": {"queues": ["q"]}}));
    assert_eq!((answer.status, answer.error_code()), (409, "conflict"), "{}", answer.body);
    assert_eq!(server.job(&waiting)["state"], "available", "the fetch did not run");
}

#[test]
fn several_acks_go_through_each_on_its_own_and_share_one_fetch() {
    let (_dir, server) = server();
    let jobs: Vec<String> =
        (0..4).map(|n| server.enqueue(json!({"type": "t", "args": [n], "options": {"queue": "q"}}))).collect();
    let held = claim(&server, "q", 2);
    let unknown = "019539a4-0000-7000-8000-000000000000";
    let body = json!({
        "acks": [{"job_id": held[0], "result": "a"}, {"job_id": unknown}, {"job_id": held[1]}, {"job_id": jobs[3]}],
        "worker_id": "w1",
        "fetch": {"queues": ["q"], "count": 5},
    });
    let answer = server.post("/svc/v1/workers/ack", body);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let acks = answer.body["acks"].as_array().unwrap();
    let outcomes: Vec<(&str, bool)> =
        acks.iter().map(|ack| (ack["job_id"].as_str().unwrap(), ack["acknowledged"].as_bool().unwrap())).collect();
    assert_eq!(outcomes, [(&*held[0], true), (unknown, false), (&*held[1], true), (&*jobs[3], false)]);
    assert_eq!(acks[1]["error"]["code"], "not_found");
    assert_eq!(
        (&acks[3]["error"]["code"], &acks[3]["error"]["details"]["expected_state"]),
        (&json!("conflict"), &json!("active"))
    );
    assert_eq!(server.job(&held[0])["result"], "a");
    // The two jobs left were claimed by the fetch (the refused ack named one of them while it waited).
    assert_eq!(ids(&answer.body["jobs"]), [jobs[2].clone(), jobs[3].clone()]);
}

#[test]
fn an_ack_whose_fetch_waits_is_durable_before_the_answer() {
    let (_dir, server) = server();
    let first = server.enqueue(json!({"type": "t", "args": [], "options": {"queue": "q"}}));
    claim(&server, "q", 1);
    let base = server.base().to_string();
    let waiting = std::thread::spawn(move || {
        let body = json!({"job_id": first, "worker_id": "w1", "fetch": {"queues": ["later"], "wait_ms": 10_000}});
        let response = common::http_client()
            .post(format!("{base}/svc/v1/workers/ack"))
            .header("content-type", "application/svc+json")
            .body(body.to_string())
            .send()
            .unwrap();
        (first, response.json::<Value>().unwrap())
    });
    // The ack is committed while its fetch waits: the job reads completed.
    let mut completed = false;
    for _ in 0..200 {
        let states = server.get("/svc/v1/queues/q/stats").body;
        if states["states"]["completed"] == 1 {
            completed = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(completed, "the ack was applied before the fetch found work");
    let next = server.enqueue(json!({"type": "t", "args": [], "options": {"queue": "later"}}));
    let (first, answer) = waiting.join().unwrap();
    assert_eq!(answer["job_id"], first.as_str());
    assert_eq!(ids(&answer["jobs"]), [next]);
}

#[test]
fn malformed_acks_are_refused_and_change_nothing() {
    let (_dir, server) = server();
    let id = server.enqueue(json!({"type": "t", "args": [], "options": {"queue": "q"}}));
    claim(&server, "q", 1);
    let too_many: Vec<Value> = (0..101).map(|_| json!({"job_id": id})).collect();
    for body in [
        json!({"acks": []}),
        json!({"acks": too_many}),
        json!({"acks": [{"job_id": id}], "job_id": id}),
        json!({"acks": [{"result": 1}]}),
        json!({"acks": "x"}),
        json!({"job_id": id, "fetch": []}),
        json!({"job_id": id, "fetch": {"queues": []}}),
        json!({"job_id": id, "worker_id": "w1", "fetch": {"queues": ["q"], "worker_id": "w2"}}),
    ] {
        let answer = server.post("/svc/v1/workers/ack", body.clone());
        assert_eq!(answer.status, 400, "{body}: {}", answer.body);
    }
    assert_eq!(server.job(&id)["state"], "active");
}

#[test]
fn an_ack_item_refused_for_its_own_content_leaves_the_others_done() {
    let (_dir, server) = server();
    (0..2).for_each(|n| {
        server.enqueue(json!({"type": "t", "args": [n], "options": {"queue": "q"}}));
    });
    let held = claim(&server, "q", 2);
    let too_large = "x".repeat(1024 * 1024 + 1);
    let body = json!({"acks": [
        {"job_id": held[0], "result": too_large},
        {"job_id": "not-an-id"},
        {"job_id": held[1], "result": {"ok": true}},
    ]});
    let answer = server.post("/svc/v1/workers/ack", body);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let acks = answer.body["acks"].as_array().unwrap();
    let codes: Vec<&str> = acks.iter().map(|ack| ack["error"]["code"].as_str().unwrap_or("")).collect();
    assert_eq!(codes, ["envelope_too_large", "not_found", ""], "{}", answer.body);
    assert_eq!(acks[1]["job_id"], "not-an-id");
    assert_eq!(
        (server.job(&held[0])["state"].as_str(), server.job(&held[1])["state"].as_str()),
        (Some("active"), Some("completed"))
    );
}
