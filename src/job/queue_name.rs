//! [`QueueName`]: a job's queue, one shared text for the jobs of a queue
//! instead of a `String` per job (8 bytes in the job and none of its own,
//! where a `String` took 24 and an allocation, and an `Arc<str>` 16).
//!
//! Names are shared through a small per-thread cache of the names used
//! last, so jobs parsed or loaded one after another for the same queue
//! point at one text; a name that falls out of the cache is only held twice.
//! Nothing is global: a name's text goes away with its last job, once no
//! thread's cache holds it (each holds at most eight).

use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use triomphe::ThinArc;

/// Names each thread keeps at hand.
const CACHED_NAMES: usize = 8;

thread_local! {
    /// The names this thread used last, the latest at the end.
    static RECENT: RefCell<Vec<QueueName>> = const { RefCell::new(Vec::new()) };
}

/// A queue's name, cheap to clone and compare: one pointer to a shared
/// allocation holding its reference count, its length and its text.
#[derive(Clone)]
pub struct QueueName(ThinArc<(), u8>);

impl QueueName {
    /// The name `text`, sharing its text with a recent equal name.
    pub fn new(text: &str) -> QueueName {
        RECENT.with(|recent| {
            let mut recent = recent.borrow_mut();
            if let Some(at) = recent.iter().rposition(|name| name.as_str() == text) {
                // The name used last goes to the end, so a busy queue stays.
                let name = recent.remove(at);
                recent.push(name.clone());
                return name;
            }
            if recent.len() == CACHED_NAMES {
                recent.remove(0);
            }
            let name = QueueName(ThinArc::from_header_and_slice((), text.as_bytes()));
            recent.push(name.clone());
            name
        })
    }

    #[allow(unsafe_code)]
    pub fn as_str(&self) -> &str {
        // SAFETY: the bytes were copied from a `&str` (`new`) and never change.
        unsafe { std::str::from_utf8_unchecked(&self.0.slice) }
    }

    /// Whether two names share one text.
    #[cfg(test)]
    fn shares_text_with(&self, other: &QueueName) -> bool {
        std::ptr::eq(self.0.ptr(), other.0.ptr())
    }
}

// Compared, hashed and ordered as their texts, as `Borrow<str>` requires.
impl PartialEq for QueueName {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.0.ptr(), other.0.ptr()) || self.as_str() == other.as_str()
    }
}

impl Eq for QueueName {}

impl std::hash::Hash for QueueName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl PartialOrd for QueueName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for QueueName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl std::ops::Deref for QueueName {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for QueueName {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl std::borrow::Borrow<str> for QueueName {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for QueueName {
    fn from(text: &str) -> Self {
        QueueName::new(text)
    }
}

impl From<String> for QueueName {
    fn from(text: String) -> Self {
        QueueName::new(&text)
    }
}

impl From<&QueueName> for String {
    fn from(name: &QueueName) -> Self {
        name.as_str().to_string()
    }
}

impl PartialEq<str> for QueueName {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for QueueName {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for QueueName {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<QueueName> for str {
    fn eq(&self, other: &QueueName) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<QueueName> for &str {
    fn eq(&self, other: &QueueName) -> bool {
        *self == other.as_str()
    }
}

impl PartialEq<QueueName> for String {
    fn eq(&self, other: &QueueName) -> bool {
        self.as_str() == other.as_str()
    }
}

impl std::fmt::Display for QueueName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for QueueName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl Serialize for QueueName {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for QueueName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = QueueName;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a queue name")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<QueueName, E> {
                Ok(QueueName::new(text))
            }
        }
        // Not `deserialize_str`: postcard reads that only from a slice it can
        // borrow, and snapshots are decoded from a reader.
        deserializer.deserialize_string(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_names_made_one_after_another_share_their_text() {
        let first = QueueName::new("mail");
        let others: Vec<QueueName> = (0..20).map(|n| QueueName::new(&format!("q{n}"))).collect();
        let again = QueueName::new("mail");
        assert_eq!(first, again);
        assert!(!first.shares_text_with(&again), "pushed out of the cache by twenty others");
        assert!(again.shares_text_with(&QueueName::new("mail")));
        assert!(others[19].shares_text_with(&QueueName::from("q19".to_string())));
        assert_eq!(again, "mail");
        assert_eq!(again.to_string(), "mail");
    }

    #[test]
    fn a_name_in_use_stays_shared_among_many_others() {
        let busy = QueueName::new("busy");
        for n in 0..100 {
            QueueName::new(&format!("tenant-{n}"));
            assert!(busy.shares_text_with(&QueueName::new("busy")), "after {n} other names");
        }
    }

    #[test]
    fn it_encodes_as_the_text_it_holds() {
        let name = QueueName::new("reports");
        let bytes = postcard::to_allocvec(&name).unwrap();
        assert_eq!(bytes, postcard::to_allocvec("reports").unwrap());
        let back: QueueName = postcard::from_bytes(&bytes).unwrap();
        assert!(back.shares_text_with(&name));
        assert_eq!(serde_json::to_string(&name).unwrap(), r#""reports""#);
    }
}
