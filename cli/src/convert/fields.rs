//! An object of the earlier manifest whose fields are taken as they are converted, so
//! what is left at the end is exactly what was not: reported, never dropped silently.

use super::findings::Findings;
use serde_json::{Map, Value};

/// An object and its path in the earlier manifest.
#[derive(Debug, Clone, Default)]
pub struct Fields {
    path: String,
    map: Map<String, Value>,
}

impl Fields {
    /// `value` at `path`; a value that is not an object is an error, and reads as empty.
    pub fn new(path: impl Into<String>, value: Value, findings: &mut Findings) -> Self {
        let path = path.into();
        let map = match value {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            other => {
                findings.error(&path, format!("expected an object, found {other}"));
                Map::new()
            }
        };
        Self { path, map }
    }

    /// The path of this object.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The path of `key` in this object.
    pub fn at(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// Takes `key` (null counts as absent).
    pub fn take(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key).filter(|v| !v.is_null())
    }

    /// Takes `key` as a string; another type is an error.
    pub fn take_str(&mut self, key: &str, findings: &mut Findings) -> Option<String> {
        match self.take(key)? {
            Value::String(s) => Some(s),
            other => {
                findings.error(self.at(key), format!("expected a string, found {other}"));
                None
            }
        }
    }

    /// Takes `key` as an integer; another type is an error.
    pub fn take_int(&mut self, key: &str, findings: &mut Findings) -> Option<i64> {
        let v = self.take(key)?;
        v.as_i64().or_else(|| {
            findings.error(self.at(key), format!("expected an integer, found {v}"));
            None
        })
    }

    /// Takes `key` as a boolean; another type is an error.
    pub fn take_bool(&mut self, key: &str, findings: &mut Findings) -> Option<bool> {
        let v = self.take(key)?;
        v.as_bool().or_else(|| {
            findings.error(self.at(key), format!("expected a boolean, found {v}"));
            None
        })
    }

    /// Takes `key` as a list of strings; another type is an error.
    pub fn take_strings(&mut self, key: &str, findings: &mut Findings) -> Vec<String> {
        match self.take(key) {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .into_iter()
                .enumerate()
                .filter_map(|(i, v)| match v {
                    Value::String(s) => Some(s),
                    other => {
                        findings.error(
                            format!("{}[{i}]", self.at(key)),
                            format!("expected a string, found {other}"),
                        );
                        None
                    }
                })
                .collect(),
            Some(other) => {
                findings.error(self.at(key), format!("expected a list, found {other}"));
                Vec::new()
            }
        }
    }

    /// Takes `key` as a list of any items (env vars, ...); another type is an error.
    pub fn take_list(&mut self, key: &str, findings: &mut Findings) -> Vec<Value> {
        match self.take(key) {
            None => Vec::new(),
            Some(Value::Array(items)) => items,
            Some(other) => {
                findings.error(self.at(key), format!("expected a list, found {other}"));
                Vec::new()
            }
        }
    }

    /// Takes `key` as a nested object.
    pub fn take_fields(&mut self, key: &str, findings: &mut Findings) -> Option<Fields> {
        let path = self.at(key);
        self.take(key).map(|v| Fields::new(path, v, findings))
    }

    /// Whether `key` is present.
    pub fn has(&self, key: &str) -> bool {
        self.map.get(key).is_some_and(|v| !v.is_null())
    }

    /// Reads `key` without taking it.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// What is left.
    pub fn into_map(self) -> Map<String, Value> {
        self.map
    }

    /// Reports every field left as having no equivalent, with `what_to_do`.
    pub fn report_rest(self, findings: &mut Findings, what_to_do: &str) {
        for key in self.map.keys() {
            let path = if self.path.is_empty() {
                key.clone()
            } else {
                format!("{}.{key}", self.path)
            };
            findings.warn(path, what_to_do);
        }
    }
}
