//! Dispatch limits (docs/api.md, "Dispatch limits"): per limit key, how many
//! jobs are active and when the recent claims were made, and whether one
//! more claim is allowed now.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::clock::Millis;
use crate::job::DispatchLimit;

/// What one limit key holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct KeyState {
    /// Active jobs that carry a limit under this key.
    pub active: u32,
    /// Times of the latest claims, oldest first: as many as the largest
    /// `rate` of the claiming job and of the live jobs under the key, the
    /// most a window check of any of them needs.
    pub claims: VecDeque<Millis>,
    /// The rates (claims per window) of the live jobs under the key, each
    /// with how many jobs carry it.
    rates: BTreeMap<u32, u32>,
}

impl KeyState {
    /// Nothing left to decide with: no active job, claim or live rate.
    fn is_unused(&self) -> bool {
        self.active == 0 && self.claims.is_empty() && self.rates.is_empty()
    }
}

/// The claims one fetch has decided under a key so far: all of them count
/// toward a concurrency limit, only those of jobs with a rate toward a
/// rate, as only those are recorded ([`DispatchTable::claimed`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    pub claims: u32,
    pub rated: u32,
}

impl Taken {
    /// One more claim, by a job limited by `limit`.
    pub fn add(&mut self, limit: &DispatchLimit) {
        self.claims += 1;
        self.rated += u32::from(limit.rate.is_some());
    }
}

/// Every key with active jobs, recent claims or live jobs with a rate.
#[derive(Debug, Default, Clone)]
pub struct DispatchTable {
    keys: HashMap<String, KeyState>,
}

impl DispatchTable {
    pub fn get(&self, key: &str) -> Option<&KeyState> {
        self.keys.get(key)
    }

    /// How many more claims `limit` allows under `key` at `now`, with
    /// `taken` already decided in this fetch (0 = at its limit).
    pub fn allowance(&self, key: &str, limit: &DispatchLimit, taken: Taken, now: Millis) -> u32 {
        let state = self.keys.get(key);
        let mut allowed = u32::MAX;
        if let Some(concurrency) = limit.concurrency {
            let active = state.map_or(0, |state| state.active) + taken.claims;
            allowed = allowed.min(concurrency.saturating_sub(active));
        }
        if let Some(rate) = &limit.rate {
            let since = now.saturating_sub(rate.period_ms as i64);
            let recent = state.map_or(0, |state| {
                let claims = &state.claims;
                (claims.len() - claims.partition_point(|at| *at <= since)) as u32
            }) + taken.rated;
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
            if state.is_unused() {
                self.keys.remove(key);
            }
        }
    }

    /// A live job limited by `limit` is under `key`: the key keeps the
    /// claims its rate needs, whichever job claims next.
    pub fn rate_held(&mut self, key: &str, limit: &DispatchLimit) {
        if let Some(rate) = &limit.rate {
            *self.entry(key).rates.entry(rate.count).or_default() += 1;
        }
    }

    /// The reverse of [`DispatchTable::rate_held`]: the job ended, or changed.
    pub fn rate_released(&mut self, key: &str, limit: &DispatchLimit) {
        let (Some(rate), Some(state)) = (&limit.rate, self.keys.get_mut(key)) else { return };
        if let Some(jobs) = state.rates.get_mut(&rate.count) {
            *jobs -= 1;
            if *jobs == 0 {
                state.rates.remove(&rate.count);
            }
        }
        if state.is_unused() {
            self.keys.remove(key);
        }
    }

    /// Records a claim at `at` by a job limited by `limit`; keeps as many
    /// claims as its rate or the largest rate of a live job under the key
    /// needs. A claim without a rate is not recorded.
    pub fn claimed(&mut self, key: &str, limit: &DispatchLimit, at: Millis) {
        let Some(rate) = &limit.rate else { return };
        let state = self.entry(key);
        let largest_live = state.rates.last_key_value().map_or(0, |(count, _)| *count);
        let keep = rate.count.max(largest_live) as usize;
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
            !state.is_unused()
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

    /// Live jobs by key and rate (for the invariant check).
    pub fn live_rates(&self) -> impl Iterator<Item = ((&str, u32), u32)> {
        self.keys.iter().flat_map(|(key, state)| state.rates.iter().map(|(rate, jobs)| ((key.as_str(), *rate), *jobs)))
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

    fn taken(claims: u32, rated: u32) -> Taken {
        Taken { claims, rated }
    }

    #[test]
    fn concurrency_counts_active_jobs_and_this_fetchs_claims() {
        let mut table = DispatchTable::default();
        let two = limit(Some(2), None);
        assert_eq!(table.allowance("k", &two, Taken::default(), 0), 2);
        table.activated("k");
        assert_eq!(table.allowance("k", &two, Taken::default(), 0), 1);
        assert_eq!(table.allowance("k", &two, taken(1, 0), 0), 0);
        assert_eq!(table.allowance("other", &two, Taken::default(), 0), 2);
        table.deactivated("k");
        assert_eq!(table.allowance("k", &two, Taken::default(), 0), 2);
        assert!(table.get("k").is_none());
    }

    #[test]
    fn a_rate_is_a_sliding_window() {
        let mut table = DispatchTable::default();
        let two_per_second = limit(None, Some((2, 1000)));
        table.claimed("k", &two_per_second, 100);
        table.claimed("k", &two_per_second, 600);
        assert_eq!(table.allowance("k", &two_per_second, Taken::default(), 1000), 0);
        assert_eq!(table.opens_at("k", &two_per_second, 1000), Some(1100));
        assert_eq!(table.allowance("k", &two_per_second, Taken::default(), 1100), 1);
        assert_eq!(table.allowance("k", &two_per_second, Taken::default(), 1600), 2);
        assert_eq!(table.allowance("k", &two_per_second, taken(3, 1), 1600), 1, "claims without a rate pass by");
        assert_eq!(table.opens_at("k", &two_per_second, 1600), None);
        table.claimed("k", &two_per_second, 1700);
        assert_eq!(table.get("k").unwrap().claims, [600, 1700], "only the latest `rate` claims are kept");
        table.forget_before(2700, 1000);
        assert!(table.get("k").is_none());
    }
}
