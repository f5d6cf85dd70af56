//! The `svc` binary: a thin command line over the library.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

mod bench;

use bench::{BenchOptions, Workload};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use svc::__private::config::{Config, ServeFlags};

// A server allocates and frees many small buffers per request; mimalloc does
// that markedly cheaper than the system allocator.
#[global_allocator]
static ALLOCATOR: Mimalloc = Mimalloc;

/// The alignment every mimalloc block has whatever its size: block sizes
/// are whole machine words.
const MI_MALLOC_ALIGN: usize = std::mem::size_of::<usize>();

/// mimalloc as the global allocator. `mimalloc::MiMalloc` sends every
/// allocation through `mi_malloc_aligned`, whose checks and fallback path
/// cost about twice the instructions of `mi_malloc` (a request makes some
/// forty allocations). Most allocations (bytes, strings, most structs) need
/// no more than word alignment, which every block has; only the rest take
/// the aligned calls.
struct Mimalloc;

// SAFETY: each method hands the request to the mimalloc call that honours
// its size and alignment; blocks from any of them are freed by `mi_free`.
#[allow(unsafe_code)]
unsafe impl std::alloc::GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        use libmimalloc_sys::{mi_malloc, mi_malloc_aligned};
        // SAFETY: plain calls into mimalloc; a null return is passed on as failure.
        unsafe {
            if layout.align() <= MI_MALLOC_ALIGN {
                mi_malloc(layout.size()).cast()
            } else {
                mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        use libmimalloc_sys::{mi_zalloc, mi_zalloc_aligned};
        // SAFETY: as in `alloc`.
        unsafe {
            if layout.align() <= MI_MALLOC_ALIGN {
                mi_zalloc(layout.size()).cast()
            } else {
                mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from this allocator, so from mimalloc.
        unsafe { libmimalloc_sys::mi_free(ptr.cast()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        use libmimalloc_sys::{mi_realloc, mi_realloc_aligned};
        // SAFETY: `ptr` came from this allocator with `layout`'s alignment,
        // which the new block keeps.
        unsafe {
            if layout.align() <= MI_MALLOC_ALIGN {
                mi_realloc(ptr.cast(), new_size).cast()
            } else {
                mi_realloc_aligned(ptr.cast(), new_size, layout.align()).cast()
            }
        }
    }
}

/// `mi_option_purge_delay` in mimalloc.h (v3): how long freed memory stays
/// committed before it is returned to the operating system.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// mimalloc's default of 10 ms hands memory back between requests, and every
/// later allocation on it pays a page fault and a zeroed page again; under
/// load that was a quarter of the server's CPU time. Ten seconds keeps memory
/// that is in steady use and still returns what a burst left behind.
const PURGE_DELAY_MS: std::ffi::c_long = 10_000;

/// `mi_option_allow_thp` in mimalloc.h (v3): whether new heap memory is
/// marked for transparent huge pages.
const MI_OPTION_ALLOW_THP: libmimalloc_sys::mi_option_t = 43;

/// Applies allocator settings, unless the environment sets them.
#[allow(unsafe_code)]
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: setting an option is thread-safe in mimalloc and takes effect
        // at the next purge decision.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
    // No transparent huge pages. The job store grows on the engine thread,
    // and a huge page makes every 2 MiB of growth one fault that zeroes all
    // of it while every writer waits. Without them, enqueue p99 and p999
    // under load were about halved and peak memory about 10 % lower, at the
    // same throughput.
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: as above; the option only steers how later OS memory is advised.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ALLOW_THP, 0) };
        // mimalloc reads the option when it starts, before `main`, so the
        // process-wide switch it would make is made here. Failure only
        // leaves huge pages on.
        #[cfg(target_os = "linux")]
        // SAFETY: PR_SET_THP_DISABLE takes plain integer arguments and
        // changes nothing but this process's huge-page policy.
        unsafe {
            libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0)
        };
    }
}

/// svc: a durable job-queue server (HTTP + JSON under /svc/v1).
#[derive(Parser)]
#[command(name = "svc", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// Run the server in the foreground until SIGTERM or SIGINT.
    ///
    /// Settings, in rising precedence: the config file, environment
    /// variables, these flags.
    Serve(ServeFlags),
    /// Check a data dir without changing it: segments, snapshots, record
    /// counts and every checksum. Exits 1 if anything is damaged.
    Inspect {
        /// The data dir to read.
        data_dir: PathBuf,
    },
    /// Copy a data dir, also while its server runs, into a new dir that
    /// opens as a consistent copy (every change acknowledged before the
    /// backup began). Check it with `svc inspect`.
    Backup {
        /// The data dir to copy.
        data_dir: PathBuf,
        /// Where the copy goes; must not exist yet.
        dest: PathBuf,
    },
    /// Drive a running server over HTTP and report jobs/s and latency.
    Bench(BenchFlags),
    /// Print the version.
    Version,
}

/// What `svc bench` drives: a workload against one address.
#[derive(Args)]
struct BenchFlags {
    /// The workload to run.
    #[arg(long, value_enum, default_value = "enqueue")]
    workload: WorkloadName,
    /// The server, as HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:8080")]
    address: String,
    /// Keep-alive connections in parallel.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    connections: u64,
    /// Jobs to run through (enqueue, drain, retry, backlog, schedules, ping).
    #[arg(long, default_value_t = 100_000)]
    jobs: u64,
    /// How long the steady workload runs, in seconds.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Jobs per second the steady workload's producers enqueue.
    #[arg(long, default_value_t = 500)]
    rate: u64,
    /// Cron entries the schedules workload registers.
    #[arg(long, default_value_t = 100_000)]
    crons: u64,
    /// The steady workload's consumers let each fetch wait this long for a
    /// job (long polling), instead of polling every millisecond.
    #[arg(long, default_value_t = 0)]
    wait_ms: u64,
    /// The enqueue workload gives every job a unique policy with a key of its own.
    #[arg(long)]
    unique: bool,
    /// Drain and steady consumers ack with `fetch`, claiming the next job in
    /// the same request (one round trip per job).
    #[arg(long)]
    ack_fetch: bool,
    /// `--target postgres*` only: the queue's tables exist already (made by
    /// an earlier run on the same database), so this run neither makes them
    /// nor loads jobs: several load generators can drive one queue.
    #[arg(long)]
    shared: bool,
    /// The fill workload's jobs are this long as JSON (at least about 30
    /// bytes), padded in their args [default: 200].
    #[arg(long)]
    job_bytes: Option<usize>,
    /// An API key to send with every request; `--key-env VAR` reads it from
    /// an environment variable instead, keeping it out of the process list.
    #[arg(long)]
    key: Option<String>,
    #[arg(long)]
    key_env: Option<String>,
    /// What the fill, steady and drain workloads drive: svc, or Redis for the side-by-side figure.
    #[arg(long, value_enum, default_value = "svc")]
    target: TargetName,
}

/// The workloads of `svc bench`.
#[derive(Clone, Copy, ValueEnum)]
enum WorkloadName {
    /// One job per request.
    Enqueue,
    /// Load jobs with batch enqueue, then fetch and ack until the queue is empty.
    Drain,
    /// Producers at a fixed rate while consumers fetch and ack, for a duration.
    Steady,
    /// Every job fails once, then succeeds.
    Retry,
    /// Load another queue with jobs half in flight, half waiting to retry.
    Backlog,
    /// Register cron entries and delayed jobs spread over time.
    Schedules,
    /// The enqueue request against any server (e.g. the hello-world ceiling).
    Ping,
    /// `--jobs` three-step chains run to completion, beside a plain drain of as many jobs.
    Chain,
    /// `--jobs` batches of 100 jobs and a callback, beside a plain drain of as many jobs.
    Group,
    /// Load `--jobs` jobs of 200 bytes (or `--job-bytes`), 100 a request;
    /// report the rate and the server's memory as the store grows.
    Fill,
}

/// What `svc bench --workload fill` fills, or `steady` drives.
#[derive(Clone, Copy, ValueEnum)]
enum TargetName {
    Svc,
    /// A Redis server: for `fill`, one `LPUSH` of the same 100 jobs a
    /// request; for `steady`, `LPUSH`, then `BLMOVE` and `LREM`; for `drain`,
    /// `LMOVE` and `LREM` until the list is empty.
    Redis,
    /// A plain job queue on PostgreSQL (`--address` is its URL): for
    /// `enqueue`, one `INSERT` a job; for `fill`, 100 jobs to an `INSERT`;
    /// for `drain`, a `SKIP LOCKED` claim and an `UPDATE` per job.
    Postgres,
    /// The same queue with the connections' requests merged into one
    /// statement per kind, as svc's PostgreSQL backend merges them (`fill`:
    /// one binary `COPY` per request of 100 jobs).
    PostgresMerged,
    /// The merged queue, moving each acked job into a history table
    /// partitioned by day: the least of what svc's PostgreSQL layout does
    /// (`fill`: each request's 100 jobs merged).
    PostgresMergedHistory,
    /// As `postgres-merged-history`, with an event row written beside each
    /// enqueue, claim and ack in the same statement.
    PostgresMergedOutbox,
}

fn main() -> ExitCode {
    tune_allocator();
    match Cli::parse().command {
        Commands::Serve(flags) => serve(&flags),
        Commands::Inspect { data_dir } => inspect(&data_dir),
        Commands::Backup { data_dir, dest } => match svc::storage::backup(&data_dir, &dest) {
            Ok(report) => {
                println!(
                    "copied {} segments and {} ({} bytes) into {}",
                    report.segments,
                    report.snapshot.map_or("no snapshot".to_string(), |path| path.display().to_string()),
                    report.bytes,
                    dest.display()
                );
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("svc: backup failed: {error}");
                ExitCode::from(1)
            }
        },
        Commands::Bench(flags) => bench(flags),
        Commands::Version => {
            println!("svc {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
    }
}

fn serve(flags: &ServeFlags) -> ExitCode {
    svc::__private::logging::init(flags.log_format, flags.log_level);
    let env: HashMap<String, String> = std::env::vars().collect();
    let config = match Config::from_flags(flags, &env) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("svc: {error}");
            return ExitCode::from(2);
        }
    };
    match svc::__private::server::run(&config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("svc: {error}");
            ExitCode::from(1)
        }
    }
}

fn inspect(dir: &std::path::Path) -> ExitCode {
    match svc::engine::inspect::inspect(dir) {
        Ok(report) => {
            print!("{report}");
            if report.is_clean() { ExitCode::SUCCESS } else { ExitCode::from(1) }
        }
        Err(error) => {
            eprintln!("svc: {error}");
            ExitCode::from(1)
        }
    }
}

fn bench(flags: BenchFlags) -> ExitCode {
    let workload = match flags.workload {
        WorkloadName::Enqueue => Workload::Enqueue,
        WorkloadName::Drain => Workload::Drain,
        WorkloadName::Steady => Workload::Steady,
        WorkloadName::Retry => Workload::Retry,
        WorkloadName::Backlog => Workload::Backlog,
        WorkloadName::Schedules => Workload::Schedules,
        WorkloadName::Ping => Workload::Ping,
        WorkloadName::Chain => Workload::Chain,
        WorkloadName::Group => Workload::Group,
        WorkloadName::Fill => Workload::Fill,
    };
    let options = BenchOptions {
        address: flags.address,
        workload,
        connections: flags.connections as usize,
        jobs: flags.jobs,
        duration: Duration::from_secs(flags.duration),
        rate: flags.rate,
        crons: flags.crons,
        wait_ms: flags.wait_ms,
        unique: flags.unique,
        ack_fetch: flags.ack_fetch,
        shared: flags.shared,
        key: flags.key.or_else(|| flags.key_env.and_then(|variable| std::env::var(variable).ok())),
        job_bytes: flags.job_bytes.unwrap_or(bench::fill::JOB_BYTES),
    };
    let postgres = match flags.target {
        TargetName::Svc | TargetName::Redis => None,
        TargetName::Postgres => Some(None),
        TargetName::PostgresMerged => Some(Some(bench::postgres::Layout::Plain)),
        TargetName::PostgresMergedHistory => Some(Some(bench::postgres::Layout::History)),
        TargetName::PostgresMergedOutbox => Some(Some(bench::postgres::Layout::Outbox)),
    };
    if flags.job_bytes.is_some() && (postgres.is_some() || !matches!(workload, Workload::Fill)) {
        eprintln!("svc bench: --job-bytes goes with the fill workload against svc or Redis");
        return ExitCode::from(2);
    }
    if flags.shared && postgres.is_none() {
        eprintln!("svc bench: --shared goes with --target postgres and the postgres-merged floors");
        return ExitCode::from(2);
    }
    if let Some(merged) = postgres {
        if !matches!(workload, Workload::Enqueue | Workload::Fill | Workload::Drain) {
            eprintln!("svc bench: --target postgres runs enqueue, fill and drain");
            return ExitCode::from(2);
        }
        return print_report(bench::run_postgres(options, merged));
    }
    if workload == Workload::Fill {
        let target = match flags.target {
            TargetName::Svc => bench::fill::Target::Svc,
            TargetName::Redis => bench::fill::Target::Redis,
            TargetName::Postgres
            | TargetName::PostgresMerged
            | TargetName::PostgresMergedHistory
            | TargetName::PostgresMergedOutbox => unreachable!("answered above"),
        };
        return print_report(bench::run_fill(options, target));
    }
    if matches!(workload, Workload::Steady | Workload::Drain) && matches!(flags.target, TargetName::Redis) {
        return print_report(bench::run_redis(options));
    }
    print_report(bench::run(options))
}

/// Prints a bench report, or why the run failed.
fn print_report(result: Result<impl std::fmt::Display, String>) -> ExitCode {
    match result {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("svc bench: {error}");
            ExitCode::from(1)
        }
    }
}
