//! [`QueueName`]: a job's queue, one shared text for the jobs of a queue
//! instead of a `String` per job (16 bytes in the job and none of its own,
//! where a `String` took 24 and an allocation).
//!
//! Names are shared through a small per-thread cache of the names used
//! last, so jobs parsed or loaded one after another for the same queue
//! point at one text; a name that falls out of the cache is only held twice.
//! Nothing is global: a name's text goes away with its last job, once no
//! thread's cache holds it (each holds at most eight).

use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::sync::Arc;

/// Names each thread keeps at hand.
const CACHED_NAMES: usize = 8;

thread_local! {
    /// The names this thread used last, the latest at the end.
    static RECENT: RefCell<Vec<Arc<str>>> = const { RefCell::new(Vec::new()) };
}

/// A queue's name, cheap to clone and compare.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueName(Arc<str>);

impl QueueName {
    /// The name `text`, sharing its text with a recent equal name.
    pub fn new(text: &str) -> QueueName {
        RECENT.with(|recent| {
            let mut recent = recent.borrow_mut();
            if let Some(at) = recent.iter().rposition(|name| &**name == text) {
                // The name used last goes to the end, so a busy queue stays.
                let name = recent.remove(at);
                recent.push(name.clone());
                return QueueName(name);
            }
            if recent.len() == CACHED_NAMES {
                recent.remove(0);
            }
            let name: Arc<str> = Arc::from(text);
            recent.push(name.clone());
            QueueName(name)
        })
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for QueueName {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for QueueName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for QueueName {
    fn borrow(&self) -> &str {
        &self.0
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
        &*self.0 == other
    }
}

impl PartialEq<&str> for QueueName {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for QueueName {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<QueueName> for str {
    fn eq(&self, other: &QueueName) -> bool {
        self == &*other.0
    }
}

impl PartialEq<QueueName> for &str {
    fn eq(&self, other: &QueueName) -> bool {
        *self == &*other.0
    }
}

impl PartialEq<QueueName> for String {
    fn eq(&self, other: &QueueName) -> bool {
        **self == *other.0
    }
}

impl std::fmt::Display for QueueName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Debug for QueueName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&*self.0, f)
    }
}

impl Serialize for QueueName {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
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
        assert!(!Arc::ptr_eq(&first.0, &again.0), "pushed out of the cache by twenty others");
        assert!(Arc::ptr_eq(&again.0, &QueueName::new("mail").0));
        assert!(Arc::ptr_eq(&others[19].0, &QueueName::from("q19".to_string()).0));
        assert_eq!(again, "mail");
        assert_eq!(again.to_string(), "mail");
    }

    #[test]
    fn a_name_in_use_stays_shared_among_many_others() {
        let busy = QueueName::new("busy");
        for n in 0..100 {
            QueueName::new(&format!("tenant-{n}"));
            assert!(Arc::ptr_eq(&busy.0, &QueueName::new("busy").0), "after {n} other names");
        }
    }

    #[test]
    fn it_encodes_as_the_text_it_holds() {
        let name = QueueName::new("reports");
        let bytes = postcard::to_allocvec(&name).unwrap();
        assert_eq!(bytes, postcard::to_allocvec("reports").unwrap());
        let back: QueueName = postcard::from_bytes(&bytes).unwrap();
        assert!(Arc::ptr_eq(&back.0, &name.0));
        assert_eq!(serde_json::to_string(&name).unwrap(), r#""reports""#);
    }
}
