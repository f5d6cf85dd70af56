//! The schema registry (docs/api.md, "Schemas"): registering and removing
//! the JSON Schemas that jobs name in `schema`.
//!
//! The feature is here: the requests, their decisions, their records
//! (`record.rs`) and how those records apply. Compiling a document and
//! checking `args` against it is `crate::schema`'s; the registry itself is a
//! durable table of the state (`State::schemas`).

pub(super) mod record;

use std::sync::Arc;

use super::api::EngineError;
use super::record::Logged;
use super::requests::{Request, Turn, sealed};
use super::state::{ApplyError, State};
use crate::schema::SchemaEntry;
use record::{SchemaDelete, SchemaPut, SchemaRecord};

/// Registers a schema compiled by the caller (`schema::parse_registration`);
/// a URI already registered is refused. Answers the stored entry.
pub struct RegisterSchema {
    pub entry: SchemaEntry,
}

impl sealed::Sealed for RegisterSchema {}

impl Request for RegisterSchema {
    type Output = Arc<SchemaEntry>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let mut entry = self.entry;
        if turn.state().schemas.contains_key(&entry.uri) {
            return Err(EngineError::SchemaExists { uri: entry.uri });
        }
        if turn.state().schemas.len() >= turn.max_schemas {
            return Err(EngineError::SchemaLimit { max_schemas: turn.max_schemas });
        }
        entry.created_at = turn.now;
        let entry = Arc::new(entry);
        turn.apply(Logged::new(turn.now, SchemaPut { entry: entry.clone() }));
        Ok(entry)
    }

    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        None
    }

    fn held_bytes(&self) -> u64 {
        let resources: usize = self.entry.resources.iter().map(|(uri, text)| uri.len() + text.len()).sum();
        (self.entry.document.len() + self.entry.uri.len() + resources) as u64
    }
}

/// Removes a schema; jobs that named it keep their `schema` field.
pub struct DeleteSchema {
    pub uri: String,
}

impl sealed::Sealed for DeleteSchema {}

impl Request for DeleteSchema {
    type Output = Arc<SchemaEntry>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let Some(entry) = turn.state().schemas.get(&self.uri).cloned() else {
            return Err(EngineError::SchemaNotFound { uri: self.uri });
        };
        turn.apply(Logged::new(turn.now, SchemaDelete { uri: self.uri }));
        Ok(entry)
    }
}

impl State {
    pub(super) fn apply_schema_record(&mut self, record: &SchemaRecord) -> Result<(), ApplyError> {
        match record {
            SchemaRecord::Put(SchemaPut { entry }) => {
                let uri = &entry.uri;
                if self.schemas.contains_key(uri) {
                    return Err(ApplyError(format!("record registers schema {uri} twice")));
                }
                self.schemas.insert(uri.clone(), entry.clone());
            }
            SchemaRecord::Delete(SchemaDelete { uri }) => {
                self.schemas.remove(uri).ok_or_else(|| ApplyError(format!("record deletes unknown schema {uri}")))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::record::decode_batch;

    #[test]
    fn records_of_the_first_format_read_as_they_were_written() {
        // Kind 26 (docs/wal-format.md), then the fields in order: 5 as a
        // zigzag varint, the URI's length and text.
        let delete = Logged::new(5, SchemaDelete { uri: "u".into() });
        assert_eq!(decode_batch(&[1, 26, 10, 1, b'u']).unwrap(), [delete]);
        let body = br#"{"uri": "urn:u", "schema": {"type": "object"}}"#;
        let entry = Arc::new(crate::schema::parse_registration(body, 7, &|_| None).unwrap().entry);
        // Kind 25, `at`, the entry.
        let mut put = vec![1, 25, 10];
        put.extend(postcard::to_allocvec(&entry).unwrap());
        assert_eq!(decode_batch(&put).unwrap(), [Logged::new(5, SchemaPut { entry })]);
    }
}
