//! Structured log lines (JSON, one per line) on standard error.
//! Never given keys, secrets, `args`, `meta` or `result`.

use serde_json::{Map, Value};

fn emit(level: &str, message: &str, fields: &[(&str, Value)]) {
    let mut line = Map::new();
    line.insert("ts".into(), jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string().into());
    line.insert("level".into(), level.into());
    line.insert("msg".into(), message.into());
    for (key, value) in fields {
        line.insert((*key).to_string(), value.clone());
    }
    eprintln!("{}", Value::Object(line));
}

pub fn info(message: &str, fields: &[(&str, Value)]) {
    emit("INFO", message, fields);
}

pub fn warn(message: &str, fields: &[(&str, Value)]) {
    emit("WARN", message, fields);
}

pub fn error(message: &str, fields: &[(&str, Value)]) {
    emit("ERROR", message, fields);
}
