//! The `svc` binary: a thin command line over the library.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use svc::bench::{BenchOptions, Workload};
use svc::config::Config;

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

const USAGE: &str = "\
svc — a durable job-queue server

usage:
  svc serve [--listen ADDR] [--data-dir DIR] [--config FILE] [--snapshot-log-bytes N] [--insecure-no-auth]
  svc inspect DATA_DIR
  svc bench --workload enqueue|drain|steady|retry|backlog|schedules|ping [--address HOST:PORT] [--connections N]
            [--jobs N] [--duration SECONDS] [--rate JOBS_PER_SECOND] [--crons N]
  svc version
";

fn main() -> ExitCode {
    tune_allocator();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(command) = args.first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest = &args[1..];
    match command.as_str() {
        "serve" => serve(rest),
        "inspect" => inspect(rest),
        "bench" => bench(rest),
        "version" | "--version" => {
            println!("svc {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        other => {
            eprintln!("unknown command {other}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn serve(args: &[String]) -> ExitCode {
    let env: HashMap<String, String> = std::env::vars().collect();
    let config = match Config::load(args, &env) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("svc: {error}");
            return ExitCode::from(2);
        }
    };
    match svc::server::run(&config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("svc: {error}");
            ExitCode::from(1)
        }
    }
}

fn inspect(args: &[String]) -> ExitCode {
    let [dir] = args else {
        eprintln!("usage: svc inspect DATA_DIR");
        return ExitCode::from(2);
    };
    match svc::engine::inspect::inspect(std::path::Path::new(dir)) {
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

fn bench(args: &[String]) -> ExitCode {
    match bench_options(args).and_then(svc::bench::run) {
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

fn bench_options(args: &[String]) -> Result<BenchOptions, String> {
    let mut options = BenchOptions {
        address: "127.0.0.1:8080".to_string(),
        workload: Workload::Enqueue,
        connections: 32,
        jobs: 100_000,
        duration: Duration::from_secs(10),
        rate: 500,
        crons: 100_000,
    };
    let mut iter = args.iter();
    while let Some(flag) = iter.next() {
        let value = iter.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || value.parse::<u64>().map_err(|_| format!("{flag} takes a whole number, not {value}"));
        match flag.as_str() {
            "--address" => options.address = value.clone(),
            "--workload" => {
                options.workload = match value.as_str() {
                    "enqueue" => Workload::Enqueue,
                    "drain" => Workload::Drain,
                    "steady" => Workload::Steady,
                    "retry" => Workload::Retry,
                    "backlog" => Workload::Backlog,
                    "schedules" => Workload::Schedules,
                    "ping" => Workload::Ping,
                    other => return Err(format!("unknown workload {other}")),
                }
            }
            "--connections" => options.connections = number()?.max(1) as usize,
            "--jobs" => options.jobs = number()?,
            "--duration" => options.duration = Duration::from_secs(number()?),
            "--rate" => options.rate = number()?,
            "--crons" => options.crons = number()?,
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(options)
}
