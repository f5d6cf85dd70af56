//! The request rate limit (docs/api.md, "Request rate limit"): at most
//! `requests` per fixed window of `window_s` seconds for each principal (the
//! client's address while svc has no authentication). The limit of wrong
//! keys per address (`auth.failed_attempts_per_minute`, docs/api.md,
//! "Authentication") counts in windows of the same kind.
//!
//! A connection looks its principal's window up once, when it is accepted;
//! each request then costs one atomic update of that window, no lock, so
//! connections of different principals never touch the same memory and those
//! of one principal share only its counter.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Principals remembered before idle ones (held by no connection) are forgotten.
const PRINCIPALS_MAX: usize = 10_000;

/// One principal's current window: its number (high 32 bits) and the
/// requests counted in it (low 32 bits).
#[derive(Debug, Default)]
pub struct Window(AtomicU64);

/// What counting one request found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    /// Unix second at which the window ends.
    pub reset_at: u64,
}

#[derive(Debug)]
pub struct RateLimiter {
    requests: u64,
    window_s: u64,
    principals: Mutex<HashMap<IpAddr, Arc<Window>>>,
}

impl RateLimiter {
    pub fn new(requests: u64, window_s: u64) -> RateLimiter {
        RateLimiter { requests, window_s: window_s.max(1), principals: Mutex::new(HashMap::new()) }
    }

    pub fn window_s(&self) -> u64 {
        self.window_s
    }

    /// Requests allowed per window.
    pub fn limit(&self) -> u64 {
        self.requests
    }

    /// The window of the principal at `address` (once per connection).
    pub fn principal(&self, address: IpAddr) -> Arc<Window> {
        let mut principals = self.principals.lock();
        if principals.len() >= PRINCIPALS_MAX && !principals.contains_key(&address) {
            principals.retain(|_, window| Arc::strong_count(window) > 1);
        }
        principals.entry(address).or_default().clone()
    }

    /// Whether the window has no request left at Unix second `now_s`
    /// (without counting one).
    pub fn exhausted(&self, window: &Window, now_s: u64) -> bool {
        let number = now_s / self.window_s;
        let current = window.0.load(Ordering::Relaxed);
        current >> 32 == number & 0xffff_ffff && current & 0xffff_ffff >= self.requests
    }

    /// A window of its own, for a principal known in advance (an API key).
    pub fn new_window(&self) -> Arc<Window> {
        Arc::new(Window::default())
    }

    /// Counts one request at Unix second `now_s`.
    pub fn take(&self, window: &Window, now_s: u64) -> Quota {
        let number = now_s / self.window_s;
        let reset_at = (number + 1) * self.window_s;
        let mut current = window.0.load(Ordering::Relaxed);
        loop {
            let count = if current >> 32 == number & 0xffff_ffff { current & 0xffff_ffff } else { 0 };
            if count >= self.requests {
                return Quota { allowed: false, limit: self.requests, remaining: 0, reset_at };
            }
            let next = ((number & 0xffff_ffff) << 32) | (count + 1);
            match window.0.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    let remaining = self.requests - count - 1;
                    return Quota { allowed: true, limit: self.requests, remaining, reset_at };
                }
                Err(seen) => current = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_allows_its_requests_then_refuses_until_the_next_one() {
        let limiter = RateLimiter::new(3, 10);
        let window = limiter.principal("127.0.0.1".parse().unwrap());
        let remaining: Vec<u64> = (0..3).map(|_| limiter.take(&window, 1_000_005).remaining).collect();
        assert_eq!(remaining, [2, 1, 0]);
        let refused = limiter.take(&window, 1_000_009);
        assert_eq!((refused.allowed, refused.reset_at), (false, 1_000_010));
        assert!(limiter.take(&window, 1_000_010).allowed, "a new window");
        let other = limiter.principal("10.0.0.1".parse().unwrap());
        assert_eq!(limiter.take(&other, 1_000_009).remaining, 2, "principals count apart");
    }

    #[test]
    fn many_threads_never_count_past_the_limit() {
        let limiter = Arc::new(RateLimiter::new(1000, 60));
        let window = limiter.principal("127.0.0.1".parse().unwrap());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (limiter, window) = (limiter.clone(), window.clone());
                std::thread::spawn(move || (0..500).filter(|_| limiter.take(&window, 120).allowed).count())
            })
            .collect();
        let allowed: usize = threads.into_iter().map(|thread| thread.join().unwrap()).sum();
        assert_eq!(allowed, 1000);
    }

    #[test]
    fn idle_principals_are_forgotten_when_many() {
        let limiter = RateLimiter::new(1, 1);
        let held = limiter.principal("127.0.0.1".parse().unwrap());
        for n in 0..PRINCIPALS_MAX as u32 + 5 {
            drop(limiter.principal(IpAddr::from(n.to_be_bytes())));
        }
        assert!(limiter.principals.lock().len() < PRINCIPALS_MAX);
        assert!(Arc::ptr_eq(&held, &limiter.principal("127.0.0.1".parse().unwrap())), "a held one stays");
    }
}
