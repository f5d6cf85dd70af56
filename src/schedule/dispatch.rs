//! Dispatch limits (docs/api.md, "Dispatch limits"): per limit key, how many
//! jobs are active and when the recent claims were made, and whether one
//! more claim is allowed now.

use std::collections::{HashMap, VecDeque};

use crate::clock::Millis;
use crate::job::DispatchLimit;

/// What one limit key holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct KeyState {
    /// Active jobs that carry a limit under this key.
    pub active: u32,
    /// Times of the latest claims, oldest first: at most as many as the
    /// largest `rate` seen under the key, the most a window check needs.
    pub claims: VecDeque<Millis>,
}

/// Every key with active jobs or recent claims.
#[derive(Debug, Default, Clone)]
pub struct DispatchTable {
    keys: HashMap<String, KeyState>,
}

impl DispatchTable {
    pub fn get(&self, key: &str) -> Option<&KeyState> {
        self.keys.get(key)
    }

    /// How many more claims `limit` allows under `key` at `now`, with
    /// `taken` claims already decided in this fetch (0 = at its limit).
    pub fn allowance(&self, key: &str, limit: &DispatchLimit, taken: u32, now: Millis) -> u32 {
        let state = self.keys.get(key);
        let mut allowed = u32::MAX;
        if let Some(concurrency) = limit.concurrency {
            let active = state.map_or(0, |state| state.active) + taken;
            allowed = allowed.min(concurrency.saturating_sub(active));
        }
        if let Some(rate) = &limit.rate {
            let since = now.saturating_sub(rate.period_ms as i64);
            let recent = state.map_or(0, |state| {
                let claims = &state.claims;
                (claims.len() - claims.partition_point(|at| *at <= since)) as u32
            }) + taken;
            allowed = allowed.min(rate.count.saturating_sub(recent));
        }
        allowed
    }

    /// When `limit` next allows a claim under `key`, if a rate window is
    /// what holds it (a concurrency limit opens on an ack, not at a time).
    pub fn opens_at(&self, key: &str, limit: &DispatchLimit, now: Millis) -> Option<Millis> {
        let rate = limit.rate.as_ref()?;
        let claims = &self.keys.get(key)?.claims;
        let count = rate.count as usize;
        if claims.len() < count {
            return None;
        }
        // The window opens when the `count`-th latest claim leaves it.
        let at = claims[claims.len() - count].saturating_add(rate.period_ms as i64);
        (at > now).then_some(at)
    }

    pub fn activated(&mut self, key: &str) {
        self.entry(key).active += 1;
    }

    pub fn deactivated(&mut self, key: &str) {
        if let Some(state) = self.keys.get_mut(key) {
            state.active = state.active.saturating_sub(1);
            if state.active == 0 && state.claims.is_empty() {
                self.keys.remove(key);
            }
        }
    }

    /// Records a claim at `at`; keeps the claims a window of `limit` needs.
    pub fn claimed(&mut self, key: &str, limit: &DispatchLimit, at: Millis) {
        let keep = limit.rate.as_ref().map_or(0, |rate| rate.count as usize);
        let state = self.entry(key);
        if keep == 0 {
            return;
        }
        state.claims.push_back(at);
        while state.claims.len() > keep {
            state.claims.pop_front();
        }
    }

    /// Forgets claims older than `horizon_ms` before `now` (no window is
    /// longer), and keys left with nothing.
    pub fn forget_before(&mut self, now: Millis, horizon_ms: i64) {
        let since = now.saturating_sub(horizon_ms);
        self.keys.retain(|_, state| {
            while state.claims.front().is_some_and(|at| *at <= since) {
                state.claims.pop_front();
            }
            state.active > 0 || !state.claims.is_empty()
        });
    }

    /// Recent claims by key, for the snapshot (sorted, so equal tables encode equal).
    pub fn claims_image(&self) -> Vec<(String, Vec<Millis>)> {
        let mut image: Vec<_> = self
            .keys
            .iter()
            .filter(|(_, state)| !state.claims.is_empty())
            .map(|(key, state)| (key.clone(), state.claims.iter().copied().collect()))
            .collect();
        image.sort();
        image
    }

    pub fn load_claims(&mut self, key: String, claims: Vec<Millis>) {
        self.keys.entry(key).or_default().claims = claims.into();
    }

    /// Active counts by key (for the invariant check).
    pub fn active_counts(&self) -> impl Iterator<Item = (&str, u32)> {
        self.keys.iter().filter(|(_, state)| state.active > 0).map(|(key, state)| (key.as_str(), state.active))
    }

    fn entry(&mut self, key: &str) -> &mut KeyState {
        if !self.keys.contains_key(key) {
            self.keys.insert(key.to_string(), KeyState::default());
        }
        self.keys.get_mut(key).expect("inserted above")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::RateWindow;

    fn limit(concurrency: Option<u32>, rate: Option<(u32, u64)>) -> DispatchLimit {
        DispatchLimit { key: None, concurrency, rate: rate.map(|(count, period_ms)| RateWindow { count, period_ms }) }
    }

    #[test]
    fn concurrency_counts_active_jobs_and_this_fetchs_claims() {
        let mut table = DispatchTable::default();
        let two = limit(Some(2), None);
        assert_eq!(table.allowance("k", &two, 0, 0), 2);
        table.activated("k");
        assert_eq!(table.allowance("k", &two, 0, 0), 1);
        assert_eq!(table.allowance("k", &two, 1, 0), 0);
        assert_eq!(table.allowance("other", &two, 0, 0), 2);
        table.deactivated("k");
        assert_eq!(table.allowance("k", &two, 0, 0), 2);
        assert!(table.get("k").is_none());
    }

    #[test]
    fn a_rate_is_a_sliding_window() {
        let mut table = DispatchTable::default();
        let two_per_second = limit(None, Some((2, 1000)));
        table.claimed("k", &two_per_second, 100);
        table.claimed("k", &two_per_second, 600);
        assert_eq!(table.allowance("k", &two_per_second, 0, 1000), 0);
        assert_eq!(table.opens_at("k", &two_per_second, 1000), Some(1100));
        assert_eq!(table.allowance("k", &two_per_second, 0, 1100), 1);
        assert_eq!(table.allowance("k", &two_per_second, 0, 1600), 2);
        assert_eq!(table.opens_at("k", &two_per_second, 1600), None);
        table.claimed("k", &two_per_second, 1700);
        assert_eq!(table.get("k").unwrap().claims, [600, 1700], "only the latest `rate` claims are kept");
        table.forget_before(2700, 1000);
        assert!(table.get("k").is_none());
    }
}
