//! The log records of the schema registry.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use crate::schema::SchemaEntry;

/// A schema registered, with the documents its references reached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchemaPut {
    pub entry: Arc<SchemaEntry>,
}

/// A schema removed from the registry; jobs that named it are untouched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchemaDelete {
    pub uri: String,
}

/// A change of the schema registry. The variant order is part of the log format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SchemaRecord {
    Put(SchemaPut),
    Delete(SchemaDelete),
}

impl SchemaRecord {
    /// The record's name, as `svc inspect` counts it.
    pub fn kind(&self) -> &'static str {
        match self {
            SchemaRecord::Put(_) => "schema_put",
            SchemaRecord::Delete(_) => "schema_delete",
        }
    }
}
