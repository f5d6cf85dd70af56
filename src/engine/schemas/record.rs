//! The log records of the schema registry.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use crate::clock::Millis;
use crate::schema::SchemaEntry;

/// A schema registered, with the documents its references reached. Encoded
/// as the struct variant it replaced, field for field (record 25).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchemaPut {
    pub at: Millis,
    pub entry: Arc<SchemaEntry>,
}

/// A schema removed from the registry; jobs that named it are untouched.
/// Encoded as the struct variant it replaced (record 26).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchemaDelete {
    pub at: Millis,
    pub uri: String,
}
