//! The floor under svc's figures: servers that do none of svc's work (no
//! parsing, no state, no rendering) but pay for the same hand-offs and the same
//! durable writes. `svc bench --workload ping` against one of them gives the
//! most any server built that way reaches on the machine, to set beside
//! `hello_ceiling.rs` (nothing durable) and svc itself.
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

/// Waiting requests and whether the taker sleeps; like svc's engine inbox, a
/// submitter wakes the taker only when it sleeps, and the taker takes all.
#[derive(Default)]
struct Inbox {
    waiting: Mutex<(Vec<Waiter>, bool)>,
    wake: Condvar,
}

impl Inbox {
    fn submit(&self, waiters: &mut Vec<Waiter>) {
        let mut waiting = self.waiting.lock();
        waiting.0.append(waiters);
        if waiting.1 {
            waiting.1 = false;
            self.wake.notify_one();
        }
    }

    fn take_all(&self, batch: &mut Vec<Waiter>) {
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
}

/// Takes batches from `inbox`; writes one block per batch if it has a log; answers them.
fn write_and_answer(inbox: &Inbox, mut log: Option<Log>) {
    let mut batch = Vec::new();
    loop {
        inbox.take_all(&mut batch);
        if let Some(log) = log.as_mut() {
            log.write_block();
        }
        for waiter in batch.drain(..) {
            let _ = waiter.send(());
        }
    }
}

fn hello() -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(br#"{"job":{"id":"hello","state":"available"}}"#)));
    *response.status_mut() = StatusCode::CREATED;
    response.headers_mut().insert("content-type", "application/svc+json".parse().expect("valid header"));
    response
}

/// The hand-off designs: a multi-threaded front end and one writer thread.
async fn threaded(address: &str, log_dir: Option<PathBuf>, lanes: usize) -> std::io::Result<()> {
    let inbox = Arc::new(Inbox::default());
    let writer_inbox = inbox.clone();
    let writer = std::thread::Builder::new().name("writer".into());
    match log_dir {
        Some(dir) if lanes > 0 => {
            let lane_inbox = Arc::new(Inbox::default());
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
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let inbox = inbox.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let inbox = inbox.clone();
                async move {
                    request.into_body().collect().await?;
                    let (waiter, answered) = oneshot::channel();
                    inbox.submit(&mut vec![waiter]);
                    let _ = answered.await;
                    Ok::<_, hyper::Error>(hello())
                }
            });
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

/// The run-to-completion design: one thread for the connections and the log.
/// A request joins the batch and wakes the commit task, which runs after the
/// tasks already runnable, so each batch holds every request read meanwhile.
async fn inline(address: &str, dir: PathBuf) -> std::io::Result<()> {
    let batch: Rc<RefCell<Vec<Waiter>>> = Rc::default();
    let due = Rc::new(Notify::new());
    let mut log = Log::open(&dir, "floor.log")?;
    let (commit_batch, commit_due) = (batch.clone(), due.clone());
    tokio::task::spawn_local(async move {
        let mut taken = Vec::new();
        loop {
            commit_due.notified().await;
            std::mem::swap(&mut *commit_batch.borrow_mut(), &mut taken);
            log.write_block();
            for waiter in taken.drain(..) {
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
                    batch.borrow_mut().push(waiter);
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
    let lanes = flag("--lanes").map(|lanes| lanes.parse().expect("--lanes takes a number")).unwrap_or(0);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(threaded(&address, flag("--durable").map(PathBuf::from), lanes))
}
