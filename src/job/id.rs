//! Job ids: UUIDv7, generated monotonically so they sort in creation order.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Hash state of maps keyed by job id: foldhash, much cheaper than the
/// standard SipHash, and seeded at random so that client-chosen ids cannot
/// be aimed at one bucket.
pub type IdHashState = foldhash::fast::RandomState;
/// A map keyed by job id.
pub type JobIdMap<V> = std::collections::HashMap<JobId, V, IdHashState>;
/// A set of job ids.
pub type JobIdSet = std::collections::HashSet<JobId, IdHashState>;

/// A UUIDv7 job id, kept as its 128-bit value.
///
/// Aligned to 8 bytes, not the 16 of a `u128`: every map entry, index key
/// and job that holds an id would otherwise round up to a multiple of 16
/// (a job-id map entry with its job handle: 24 bytes instead of 32).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[repr(C, packed(8))]
pub struct JobId(pub u128);

impl JobId {
    /// Parses the lowercase hyphenated form with version 7 and the RFC 4122 variant,
    /// exactly the pattern of the interface. Anything else is `None`.
    pub fn parse(text: &str) -> Option<JobId> {
        Self::parse_hex(text, false)
    }

    /// Like [`JobId::parse`], but upper-case hex digits are read too.
    pub fn parse_any_case(text: &str) -> Option<JobId> {
        Self::parse_hex(text, true)
    }

    fn parse_hex(text: &str, upper_case: bool) -> Option<JobId> {
        let bytes = text.as_bytes();
        if bytes.len() != 36 {
            return None;
        }
        let mut value: u128 = 0;
        for (index, &byte) in bytes.iter().enumerate() {
            if matches!(index, 8 | 13 | 18 | 23) {
                if byte != b'-' {
                    return None;
                }
                continue;
            }
            let digit = match byte {
                b'0'..=b'9' => byte - b'0',
                b'a'..=b'f' => byte - b'a' + 10,
                b'A'..=b'F' if upper_case => byte - b'A' + 10,
                _ => return None,
            };
            value = (value << 4) | u128::from(digit);
        }
        let id = JobId(value);
        (id.version() == 7 && id.variant_ok()).then_some(id)
    }

    /// The Unix millisecond the id carries in its first 48 bits.
    pub fn timestamp_ms(self) -> i64 {
        (self.0 >> 80) as i64
    }

    /// The id an [`IdGenerator`] makes right after this one within the same
    /// millisecond (its counter plus one), or `None` where the counter is
    /// full. Ids made one after another with no other id between are linked
    /// this way, which lets a run of them be stored as the first and a count.
    #[cfg(any(feature = "postgres", test))]
    pub(crate) fn next_in_millisecond(self) -> Option<JobId> {
        let counter = unpack_counter(self.0);
        (counter < RANDOM_MASK).then(|| JobId(pack(self.timestamp_ms(), counter + 1)))
    }

    fn version(self) -> u8 {
        ((self.0 >> 76) & 0xf) as u8
    }

    fn variant_ok(self) -> bool {
        (self.0 >> 62) & 0b11 == 0b10
    }
}

impl JobId {
    /// The lowercase hyphenated form, without allocating.
    pub fn to_hyphenated(self) -> [u8; 36] {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        /// Where each byte's two digits go: 8-4-4-4-12 digits between hyphens.
        const AT: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];
        let mut out = [b'-'; 36];
        for (byte, at) in self.0.to_be_bytes().into_iter().zip(AT) {
            out[at] = HEX[usize::from(byte >> 4)];
            out[at + 1] = HEX[usize::from(byte & 0xf)];
        }
        out
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.to_hyphenated();
        f.write_str(std::str::from_utf8(&text).expect("hex digits and hyphens are ASCII"))
    }
}

impl fmt::Debug for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Declares an id of something other than a job: a UUIDv7 like a job's, a
/// type of its own so that one kind of id is never passed for another. It
/// is written (and stored) exactly as the [`JobId`] it wraps.
macro_rules! typed_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub JobId);

        impl $name {
            /// Parses the lowercase hyphenated UUIDv7 form, as [`JobId::parse`].
            pub fn parse(text: &str) -> Option<$name> {
                JobId::parse(text).map($name)
            }

            /// Like `parse`, but upper-case hex digits are read too.
            pub fn parse_any_case(text: &str) -> Option<$name> {
                JobId::parse_any_case(text).map($name)
            }

            /// The Unix millisecond the id carries.
            pub fn timestamp_ms(self) -> i64 {
                self.0.timestamp_ms()
            }
        }

        impl From<JobId> for $name {
            fn from(id: JobId) -> $name {
                $name(id)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

typed_id!(
    /// A workflow's id (shown as the bare UUID).
    WorkflowId
);
typed_id!(
    /// A webhook subscription's id (shown as `sub_<uuid>`).
    SubscriptionId
);
typed_id!(
    /// A webhook delivery's id (shown as `del_<uuid>`), the same on every attempt.
    DeliveryId
);

/// Makes UUIDv7 values that strictly increase, even within one millisecond or
/// when the clock steps back: within one millisecond the 74-bit counter counts
/// up, and when it runs out the id moves on to the next millisecond.
///
/// Only at the very end of the 48-bit millisecond range (the year 10889) can
/// it not go on increasing; it then starts again at `now`, so its caller must
/// check a fresh id against the ids in use (the engine does).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IdGenerator {
    last: u128,
}

const RANDOM_BITS: u32 = 74;
const RANDOM_MASK: u128 = (1 << RANDOM_BITS) - 1;
/// The largest millisecond a UUIDv7 holds.
const MS_MAX: i64 = (1 << 48) - 1;

impl IdGenerator {
    pub fn next(&mut self, now_ms: i64, random: u128) -> JobId {
        let last_ms = (self.last >> 80) as i64;
        let last_counter = unpack_counter(self.last);
        let fresh = |ms: i64| (ms, (random & RANDOM_MASK) >> 1);
        let (ms, counter) = if now_ms > last_ms {
            // Leave headroom in the counter so ids made in the same millisecond
            // can keep counting up.
            fresh(now_ms.min(MS_MAX))
        } else if last_counter < RANDOM_MASK {
            (last_ms, last_counter + 1)
        } else if last_ms < MS_MAX {
            (last_ms + 1, 0)
        } else {
            fresh(now_ms.clamp(0, MS_MAX))
        };
        let value = pack(ms, counter);
        self.last = value;
        JobId(value)
    }

    /// Makes sure later ids sort after `id` (a client-supplied or replayed id).
    pub fn observe(&mut self, id: JobId) {
        if id.0 > self.last {
            self.last = id.0;
        }
    }
}

fn unpack_counter(value: u128) -> u128 {
    let rand_a = (value >> 64) & 0xfff;
    let rand_b = value & ((1 << 62) - 1);
    (rand_a << 62) | rand_b
}

fn pack(ms: i64, counter: u128) -> u128 {
    let rand_a = (counter >> 62) & 0xfff;
    let rand_b = counter & ((1 << 62) - 1);
    ((ms as u128 & 0xffff_ffff_ffff) << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_parse_and_increase() {
        let mut generator = IdGenerator::default();
        let mut previous = generator.next(1_700_000_000_000, u128::MAX);
        for step in 0..1000 {
            let id = generator.next(1_700_000_000_000 - (step % 3), step as u128 * 7919);
            assert!(id > previous, "{id} after {previous}");
            assert_eq!(JobId::parse(&id.to_string()), Some(id));
            previous = id;
        }
    }

    #[test]
    fn ids_made_in_one_millisecond_follow_each_other() {
        let mut generator = IdGenerator::default();
        // A counter about to carry from its low 62 bits into the next 12.
        generator.observe(JobId(pack(1_700_000_000_000, (1 << 62) - 2)));
        let mut previous = generator.next(1_700_000_000_000, 0);
        for _ in 0..4 {
            let id = generator.next(1_700_000_000_000, 0);
            assert_eq!(previous.next_in_millisecond(), Some(id));
            assert_eq!(JobId::parse(&id.to_string()), Some(id));
            previous = id;
        }
        assert_eq!(JobId(pack(1_700_000_000_000, RANDOM_MASK)).next_in_millisecond(), None);
    }

    #[test]
    fn a_full_counter_moves_on_to_the_next_millisecond() {
        let mut generator = IdGenerator::default();
        generator.observe(JobId::parse("ffffffff-fffe-7fff-bfff-ffffffffffff").unwrap());
        let last_ms = generator.next(1_700_000_000_000, 0);
        assert_eq!(last_ms.to_string(), "ffffffff-ffff-7000-8000-000000000000");
        generator.observe(JobId::parse("ffffffff-ffff-7fff-bfff-ffffffffffff").unwrap());
        // Past the last millisecond a UUIDv7 holds, it starts again at now.
        let again = generator.next(1_700_000_000_000, 12345 << 1);
        assert_eq!(again.timestamp_ms(), 1_700_000_000_000);
        assert_eq!(JobId::parse(&again.to_string()), Some(again));

        let mut generator = IdGenerator::default();
        generator.observe(JobId::parse("01946000-0000-7fff-bfff-ffffffffffff").unwrap());
        let next = generator.next(0, 0);
        assert_eq!(next.to_string(), "01946000-0001-7000-8000-000000000000");
    }

    #[test]
    fn ids_print_as_lowercase_hyphenated_uuids() {
        for value in
            [0u128, u128::MAX, 0x019461a8_1a2b_7c3d_8e4f_5a6b7c8d9e0f, 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210]
        {
            let expected = uuid::Uuid::from_u128(value).hyphenated().to_string();
            assert_eq!(std::str::from_utf8(&JobId(value).to_hyphenated()).unwrap(), expected);
        }
    }

    #[test]
    fn parse_rejects_other_forms() {
        assert!(JobId::parse("019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f").is_some());
        assert!(JobId::parse("019461A8-1A2B-7C3D-8E4F-5A6B7C8D9E0F").is_none());
        assert_eq!(
            JobId::parse_any_case("019461A8-1a2B-7C3D-8E4F-5A6B7C8D9E0F"),
            JobId::parse("019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f")
        );
        assert!(JobId::parse_any_case("019461G8-1A2B-7C3D-8E4F-5A6B7C8D9E0F").is_none());
        assert!(JobId::parse("550e8400-e29b-41d4-a716-446655440000").is_none());
        assert!(JobId::parse("019461a8-1a2b-7c3d-4e4f-5a6b7c8d9e0f").is_none());
        assert!(JobId::parse("").is_none());
    }
}
