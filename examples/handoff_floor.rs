//! The floor under svc's figures: servers that do none of svc's work (no
//! validation, no job records, no rendering beyond what a client reads) but
//! pay for the same hand-offs and the same durable writes. `svc bench
//! --workload ping` against one of them gives the most any server built
//! that way reaches on the machine, to set beside `hello_ceiling.rs`
//! (nothing durable) and svc itself.
//!
//! ```text
//! handoff_floor ADDR                          each request is handed to a writer thread and
//!                                             answered when it says so (svc's engine hand-off)
//! handoff_floor ADDR --durable DIR            the writer also writes one 4 KiB block per batch
//!                                             with O_DIRECT | O_DSYNC first (svc's group commit)
//! handoff_floor ADDR --durable DIR --lanes N  the writer passes batches to N writing threads, so
//!                                             several writes are in flight, in no kept order
//! handoff_floor ADDR --inline DIR             one thread, no hand-off: requests batch up while
//!                                             the thread runs, and it blocks on one write per
//!                                             batch (Redis's `appendfsync always`)
//! handoff_floor ADDR --durable DIR --contract  batch enqueue's least work under svc's interface:
//!                                             each body is parsed as a batch of jobs (type, args,
//!                                             queue), written whole with the others of its commit,
//!                                             and answered with every job rendered as svc
//!                                             renders a new one (an id, its fields, two times)
//! handoff_floor ADDR --durable DIR --contract --keep
//!                                             the same, and the writer keeps every job: its
//!                                             fields in one allocation made by the request
//!                                             thread, found by id in a map and queued in order
//!                                             (the least a server that serves jobs back holds)
//! handoff_floor ADDR --queue DIR              the steady workload's least work under svc's design:
//!                                             enqueue, fetch (a waiting fetch is handed the next
//!                                             job in the commit that writes it) and ack, each
//!                                             batch written durably by one writer thread
//! ```
//!
//! Run with `cargo run --release --example handoff_floor -- 127.0.0.1:8091 --durable /tmp/floor`.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use parking_lot::{Condvar, Mutex};
use std::cell::RefCell;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::{Notify, oneshot};

type Waiter = oneshot::Sender<()>;

/// A request waiting for its commit: the bytes to write (none outside
/// `--contract`, where a commit writes one block), the jobs to keep (none
/// outside `--keep`) and whom to answer.
type Pending = (Bytes, Vec<Kept>, Waiter);

/// A job as `--keep` holds it: its id, and its type, queue and args in one
/// allocation.
type Kept = (u128, Box<[u8]>);

/// Every job kept under `--keep`, found by id (with svc's fast hash, not
/// the standard map's) and queued in arrival order.
#[derive(Default)]
struct Store {
    jobs: std::collections::HashMap<u128, Box<[u8]>, foldhash::fast::RandomState>,
    ready: std::collections::VecDeque<u128>,
}

impl Store {
    fn keep(&mut self, batch: &mut [Pending]) {
        for (_, kept, _) in batch {
            for (id, job) in kept.drain(..) {
                self.jobs.insert(id, job);
                self.ready.push_back(id);
            }
        }
    }
}

/// Waiting requests and whether the taker sleeps; like svc's engine inbox, a
/// submitter wakes the taker only when it sleeps, and the taker takes all.
struct Inbox<T> {
    waiting: Mutex<(Vec<T>, bool)>,
    wake: Condvar,
}

impl<T> Default for Inbox<T> {
    fn default() -> Self {
        Inbox { waiting: Mutex::new((Vec::new(), false)), wake: Condvar::new() }
    }
}

impl<T> Inbox<T> {
    fn submit(&self, waiters: &mut Vec<T>) {
        let mut waiting = self.waiting.lock();
        waiting.0.append(waiters);
        if waiting.1 {
            waiting.1 = false;
            self.wake.notify_one();
        }
    }

    fn take_all(&self, batch: &mut Vec<T>) {
        let mut waiting = self.waiting.lock();
        while waiting.0.is_empty() {
            waiting.1 = true;
            self.wake.wait(&mut waiting);
        }
        std::mem::swap(&mut waiting.0, batch);
    }
}

const BLOCK: usize = 4096;
const LOG_BYTES: u64 = 64 << 20;

/// A pre-zeroed file, written one aligned block per batch, round and round.
struct Log {
    file: File,
    buffer: Vec<u8>,
    offset: u64,
}

impl Log {
    fn open(dir: &Path, name: &str) -> std::io::Result<Log> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(name);
        std::fs::write(&path, vec![0u8; LOG_BYTES as usize])?;
        File::open(&path)?.sync_all()?;
        let file = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_DIRECT | libc::O_DSYNC).open(&path)?;
        // O_DIRECT needs an aligned buffer: take the aligned block inside a larger one.
        Ok(Log { file, buffer: vec![7u8; BLOCK * 2], offset: 0 })
    }

    fn write_block(&mut self) {
        let start = self.buffer.as_ptr().align_offset(BLOCK);
        self.file.write_all_at(&self.buffer[start..start + BLOCK], self.offset).expect("durable write");
        self.offset = (self.offset + BLOCK as u64) % LOG_BYTES;
    }

    /// Writes a commit: the bodies of its requests in one write, padded to
    /// whole blocks, or one block when they carry none.
    fn write_commit(&mut self, batch: &[Pending]) {
        let bytes: usize = batch.iter().map(|(body, ..)| body.len()).sum();
        if bytes == 0 {
            return self.write_block();
        }
        let padded = bytes.div_ceil(BLOCK) * BLOCK;
        if self.buffer.len() < padded + BLOCK {
            self.buffer.resize(padded + BLOCK, 0);
        }
        let start = self.buffer.as_ptr().align_offset(BLOCK);
        let mut at = start;
        for (body, ..) in batch {
            self.buffer[at..at + body.len()].copy_from_slice(body);
            at += body.len();
        }
        if self.offset + padded as u64 > LOG_BYTES {
            self.offset = 0;
        }
        self.file.write_all_at(&self.buffer[start..start + padded], self.offset).expect("durable write");
        self.offset += padded as u64;
    }
}

/// Takes batches from `inbox`; keeps their jobs; writes one block per batch
/// if it has a log; answers them.
fn write_and_answer(inbox: &Inbox<Pending>, mut log: Option<Log>) {
    let mut batch = Vec::new();
    let mut store = Store::default();
    loop {
        inbox.take_all(&mut batch);
        store.keep(&mut batch);
        if let Some(log) = log.as_mut() {
            log.write_commit(&batch);
        }
        for (.., waiter) in batch.drain(..) {
            let _ = waiter.send(());
        }
    }
}

/// An answer of `status` with `body`, in svc's media type.
fn json(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert("content-type", "application/svc+json".parse().expect("valid header"));
    response
}

fn hello() -> Response<Full<Bytes>> {
    json(StatusCode::CREATED, r#"{"job":{"id":"hello","state":"available"}}"#)
}

/// One job of a batch, as far as `--contract` reads it; other fields are
/// skipped, but must be well-formed JSON.
#[derive(serde::Deserialize)]
struct Item<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    args: &'a serde_json::value::RawValue,
    #[serde(default, borrow)]
    options: Option<ItemOptions<'a>>,
}

#[derive(serde::Deserialize)]
struct ItemOptions<'a> {
    #[serde(default, borrow)]
    queue: Option<std::borrow::Cow<'a, str>>,
}

#[derive(serde::Deserialize)]
struct BatchBody<'a> {
    #[serde(borrow)]
    jobs: Vec<Item<'a>>,
}

/// Parses a batch and renders its jobs as new ones, the way svc's answer
/// carries them, and with `keep` gathers them to be kept; `None` when the
/// body is not a batch.
fn render_batch(body: &[u8], next_id: &std::sync::atomic::AtomicU64, keep: bool) -> Option<(Vec<u8>, Vec<Kept>)> {
    use std::io::Write;
    let batch: BatchBody = serde_json::from_slice(body).ok()?;
    let now = jiff::Timestamp::now();
    let time = now.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string();
    let millis = now.as_millisecond() as u64;
    let first = next_id.fetch_add(batch.jobs.len() as u64, std::sync::atomic::Ordering::Relaxed);
    let mut out = Vec::with_capacity(body.len() * 3);
    let mut kept = Vec::with_capacity(if keep { batch.jobs.len() } else { 0 });
    out.extend_from_slice(br#"{"jobs":["#);
    for (n, item) in batch.jobs.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        let id = uuid::Uuid::from_u64_pair(millis << 16 | 0x7000, 0x8000_0000_0000_0000 | (first + n as u64));
        let queue = item.options.as_ref().and_then(|options| options.queue.as_deref()).unwrap_or("default");
        if keep {
            let fields = [item.kind.as_bytes(), queue.as_bytes(), item.args.get().as_bytes()].concat();
            kept.push((id.as_u128(), fields.into_boxed_slice()));
        }
        write!(
            out,
            r#"{{"specversion":"1.0","id":"{id}","type":{kind},"queue":{queue},"args":{args},"meta":{{}},"state":"available","priority":0,"attempt":0,"max_attempts":3,"timeout":30,"timeout_ms":30000,"visibility_timeout":30,"visibility_timeout_ms":30000,"retry":{{"max_attempts":3,"initial_interval":"PT1S","backoff_coefficient":2.0,"max_interval":"PT5M","jitter":true,"non_retryable_errors":[],"on_exhaustion":"discard"}},"tags":[],"created_at":"{time}","enqueued_at":"{time}"}}"#,
            kind = serde_json::Value::from(item.kind.as_ref()),
            queue = serde_json::Value::from(queue),
            args = item.args.get(),
        )
        .ok()?;
    }
    write!(out, r#"],"count":{}}}"#, batch.jobs.len()).ok()?;
    Some((out, kept))
}

/// The hand-off designs: a multi-threaded front end and one writer thread.
async fn threaded(
    address: &str,
    log_dir: Option<PathBuf>,
    lanes: usize,
    contract: bool,
    keep: bool,
) -> std::io::Result<()> {
    let inbox = Arc::new(Inbox::<Pending>::default());
    let writer_inbox = inbox.clone();
    let writer = std::thread::Builder::new().name("writer".into());
    match log_dir {
        Some(dir) if lanes > 0 => {
            let lane_inbox = Arc::new(Inbox::<Pending>::default());
            for lane in 0..lanes {
                let (lane_inbox, log) = (lane_inbox.clone(), Log::open(&dir, &format!("lane-{lane}.log"))?);
                std::thread::spawn(move || write_and_answer(&lane_inbox, Some(log)));
            }
            writer.spawn(move || {
                let mut batch = Vec::new();
                loop {
                    writer_inbox.take_all(&mut batch);
                    lane_inbox.submit(&mut batch);
                }
            })?;
        }
        Some(dir) => {
            let log = Log::open(&dir, "floor.log")?;
            writer.spawn(move || write_and_answer(&writer_inbox, Some(log)))?;
        }
        None => {
            writer.spawn(move || write_and_answer(&writer_inbox, None))?;
        }
    }
    let listener = TcpListener::bind(address).await?;
    eprintln!("handoff floor listening on {}", listener.local_addr()?);
    let next_id = Arc::new(std::sync::atomic::AtomicU64::new(0));
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let (inbox, next_id) = (inbox.clone(), next_id.clone());
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let (inbox, next_id) = (inbox.clone(), next_id.clone());
                async move {
                    let body = request.into_body().collect().await?.to_bytes();
                    if !contract {
                        let (waiter, answered) = oneshot::channel();
                        inbox.submit(&mut vec![(Bytes::new(), Vec::new(), waiter)]);
                        let _ = answered.await;
                        return Ok::<_, hyper::Error>(hello());
                    }
                    let Some((rendered, kept)) = render_batch(&body, &next_id, keep) else {
                        let mut refused = Response::new(Full::new(Bytes::from_static(b"{}")));
                        *refused.status_mut() = StatusCode::BAD_REQUEST;
                        return Ok(refused);
                    };
                    let (waiter, answered) = oneshot::channel();
                    inbox.submit(&mut vec![(body, kept, waiter)]);
                    let _ = answered.await;
                    Ok(json(StatusCode::CREATED, rendered))
                }
            });
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

/// A job of `--queue`: its id and its `args`.
type QueuedJob = (u64, Box<str>);

/// A request of `--queue`: svc's steady workload, at its least.
enum Command {
    /// A new job's `args`, answered with its id once written.
    Enqueue(Box<str>, oneshot::Sender<u64>),
    /// A fetch: answered with a job in the commit that claims it, which is
    /// the commit that writes the job when the fetch waited for one. One
    /// that may not wait (`false`) is answered with none at once when no
    /// job is ready.
    Fetch(bool, oneshot::Sender<Option<QueuedJob>>),
    /// An ack, answered once written.
    Ack(oneshot::Sender<()>),
}

/// The writer of `--queue`: every batch's new jobs, claims and acks in one
/// durable write, then the answers. A fetch that finds no job waits; a job
/// enqueued while a fetch waits is claimed for it in the same commit (as
/// svc's engine does), so one write covers both.
fn serve_queue(inbox: &Inbox<Command>, mut log: Log) {
    type Claim = oneshot::Sender<Option<QueuedJob>>;
    let mut batch = Vec::new();
    let mut ready: std::collections::VecDeque<QueuedJob> = Default::default();
    let mut waiting: std::collections::VecDeque<Claim> = Default::default();
    let (mut enqueued, mut acked, mut claimed) = (Vec::new(), Vec::new(), Vec::<(Claim, QueuedJob)>::new());
    let (mut at_once, mut given_back) = (Vec::<Claim>::new(), Vec::new());
    let mut next_id = 0;
    loop {
        // A job given back by a fetch that stopped waiting is offered to
        // the others before the writer sleeps.
        if ready.is_empty() || waiting.iter().all(|fetch| fetch.is_closed()) {
            inbox.take_all(&mut batch);
        }
        for command in batch.drain(..) {
            match command {
                Command::Enqueue(args, answer) => {
                    next_id += 1;
                    ready.push_back((next_id, args));
                    enqueued.push((answer, next_id));
                }
                Command::Fetch(false, answer) => at_once.push(answer),
                Command::Fetch(true, answer) => waiting.push_back(answer),
                Command::Ack(answer) => acked.push(answer),
            }
        }
        // Fetches that stopped waiting claim nothing.
        waiting.retain(|fetch| !fetch.is_closed());
        while !ready.is_empty()
            && let Some(fetch) = waiting.pop_front()
        {
            claimed.push((fetch, ready.pop_front().expect("not empty")));
        }
        // Fetches that may not wait take what is left, or are answered now.
        for fetch in at_once.drain(..) {
            match ready.pop_front() {
                Some(job) => claimed.push((fetch, job)),
                None => {
                    let _ = fetch.send(None);
                }
            }
        }
        if enqueued.is_empty() && acked.is_empty() && claimed.is_empty() {
            continue;
        }
        log.write_block();
        for (answer, id) in enqueued.drain(..) {
            let _ = answer.send(id);
        }
        for answer in acked.drain(..) {
            let _ = answer.send(());
        }
        for (fetch, job) in claimed.drain(..) {
            if let Err(Some(job)) = fetch.send(Some(job)) {
                given_back.push(job);
            }
        }
        // Back at the front, in the order they were claimed.
        while let Some(job) = given_back.pop() {
            ready.push_front(job);
        }
    }
}

/// The fields of `--queue`'s requests it reads.
#[derive(serde::Deserialize)]
struct QueueRequest<'a> {
    #[serde(default, borrow)]
    args: Option<&'a serde_json::value::RawValue>,
    #[serde(default)]
    wait_ms: u64,
}

/// Answers one `--queue` request: enqueue, fetch (waiting up to its
/// `wait_ms`), ack, or the health probe.
async fn queue_request(
    inbox: &Inbox<Command>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let path = request.uri().path().to_string();
    let body = request.into_body().collect().await?.to_bytes();
    let Ok(fields) = serde_json::from_slice::<QueueRequest>(if body.is_empty() { b"{}" } else { &body }) else {
        return Ok(json(StatusCode::BAD_REQUEST, "{}"));
    };
    Ok(match path.as_str() {
        "/svc/v1/jobs" => {
            let args = fields.args.map_or("[]", |args| args.get()).into();
            let (answer, answered) = oneshot::channel();
            inbox.submit(&mut vec![Command::Enqueue(args, answer)]);
            let Ok(id) = answered.await else { return Ok(json(StatusCode::SERVICE_UNAVAILABLE, "{}")) };
            json(StatusCode::CREATED, format!(r#"{{"job":{{"id":"{id}","state":"available"}}}}"#))
        }
        "/svc/v1/workers/fetch" => {
            let (answer, mut answered) = oneshot::channel();
            inbox.submit(&mut vec![Command::Fetch(fields.wait_ms > 0, answer)]);
            let job = if fields.wait_ms == 0 {
                // One that may not wait is answered by the writer either way.
                answered.await.ok().flatten()
            } else {
                match tokio::time::timeout(std::time::Duration::from_millis(fields.wait_ms), &mut answered).await {
                    Ok(answer) => answer.ok().flatten(),
                    // Closed first, so that a claim the writer made meanwhile
                    // is answered here, not lost; one it makes after goes back.
                    Err(_) => {
                        answered.close();
                        answered.try_recv().ok().flatten()
                    }
                }
            };
            match job {
                Some((id, args)) => {
                    json(StatusCode::OK, format!(r#"{{"jobs":[{{"id":"{id}","attempt":1,"args":{args}}}]}}"#))
                }
                None => json(StatusCode::OK, r#"{"jobs":[]}"#),
            }
        }
        "/svc/v1/workers/ack" => {
            let (answer, answered) = oneshot::channel();
            inbox.submit(&mut vec![Command::Ack(answer)]);
            let _ = answered.await;
            json(StatusCode::OK, "{}")
        }
        "/svc/v1/health" => json(StatusCode::OK, r#"{"status":"ok"}"#),
        _ => json(StatusCode::NOT_FOUND, "{}"),
    })
}

/// The queue design at its least: a multi-threaded front end and one writer
/// thread that keeps the jobs, claims them for waiting fetches and writes
/// each batch durably before answering.
async fn queue(address: &str, dir: PathBuf) -> std::io::Result<()> {
    let inbox = Arc::new(Inbox::<Command>::default());
    let (writer_inbox, log) = (inbox.clone(), Log::open(&dir, "floor.log")?);
    std::thread::Builder::new().name("writer".into()).spawn(move || serve_queue(&writer_inbox, log))?;
    let listener = TcpListener::bind(address).await?;
    eprintln!("handoff floor (queue) listening on {}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let inbox = inbox.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let inbox = inbox.clone();
                async move { queue_request(&inbox, request).await }
            });
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

/// The run-to-completion design: one thread for the connections and the log.
/// A request joins the batch and wakes the commit task, which runs after the
/// tasks already runnable, so each batch holds every request read meanwhile.
async fn inline(address: &str, dir: PathBuf) -> std::io::Result<()> {
    let batch: Rc<RefCell<Vec<Pending>>> = Rc::default();
    let due = Rc::new(Notify::new());
    let mut log = Log::open(&dir, "floor.log")?;
    let (commit_batch, commit_due) = (batch.clone(), due.clone());
    tokio::task::spawn_local(async move {
        let mut taken = Vec::new();
        loop {
            commit_due.notified().await;
            std::mem::swap(&mut *commit_batch.borrow_mut(), &mut taken);
            log.write_block();
            for (.., waiter) in taken.drain(..) {
                let _ = waiter.send(());
            }
        }
    });
    let listener = TcpListener::bind(address).await?;
    eprintln!("handoff floor (inline) listening on {}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let (batch, due) = (batch.clone(), due.clone());
        tokio::task::spawn_local(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let (batch, due) = (batch.clone(), due.clone());
                async move {
                    request.into_body().collect().await?;
                    let (waiter, answered) = oneshot::channel();
                    batch.borrow_mut().push((Bytes::new(), Vec::new(), waiter));
                    due.notify_one();
                    let _ = answered.await;
                    Ok::<_, hyper::Error>(hello())
                }
            });
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let address = args.first().cloned().unwrap_or_else(|| "127.0.0.1:8091".to_string());
    let flag = |name: &str| args.iter().position(|arg| arg == name).and_then(|at| args.get(at + 1)).cloned();
    if let Some(dir) = flag("--inline") {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        return runtime.block_on(tokio::task::LocalSet::new().run_until(inline(&address, PathBuf::from(dir))));
    }
    if let Some(dir) = flag("--queue") {
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        return runtime.block_on(queue(&address, PathBuf::from(dir)));
    }
    let lanes = flag("--lanes").map(|lanes| lanes.parse().expect("--lanes takes a number")).unwrap_or(0);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let contract = args.iter().any(|arg| arg == "--contract");
    let keep = contract && args.iter().any(|arg| arg == "--keep");
    runtime.block_on(threaded(&address, flag("--durable").map(PathBuf::from), lanes, contract, keep))
}
