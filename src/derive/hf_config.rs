//! Reading a Hugging Face `config.json`: typed access to its fields, with
//! errors that name the file and the field.

use std::path::Path;

use serde_json::{Map, Value};

use super::error::DeriveError;

/// A parsed `config.json`: its top-level object, where it came from and its `model_type`.
#[derive(Clone, Debug)]
pub struct HfConfig {
    /// Where the config came from, for messages: the path, followed by the
    /// field name for a nested table.
    pub source: String,
    /// The config's `model_type` (never empty).
    pub model_type: String,
    fields: Map<String, Value>,
}

impl HfConfig {
    /// Read and parse a config file.
    pub fn load(path: &Path) -> Result<Self, DeriveError> {
        let text = std::fs::read_to_string(path).map_err(|source| DeriveError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&path.display().to_string(), &text)
    }

    /// Parse a config's text; `source` names it in messages.
    pub fn parse(source: &str, text: &str) -> Result<Self, DeriveError> {
        let value: Value = serde_json::from_str(text).map_err(|e| DeriveError::Json {
            source_name: source.to_string(),
            detail: e.to_string(),
        })?;
        let Value::Object(fields) = value else {
            return Err(DeriveError::Json {
                source_name: source.to_string(),
                detail: "the top level is not an object".to_string(),
            });
        };
        let model_type = match fields.get("model_type") {
            Some(Value::String(t)) if !t.is_empty() => t.clone(),
            _ => {
                return Err(DeriveError::NoModelType {
                    source_name: source.to_string(),
                })
            }
        };
        Ok(HfConfig {
            source: source.to_string(),
            model_type,
            fields,
        })
    }

    /// The field's value, `None` when absent or JSON `null`.
    pub fn value(&self, field: &str) -> Option<&Value> {
        self.fields.get(field).filter(|v| !v.is_null())
    }

    fn missing(&self, field: &str, why: &'static str) -> DeriveError {
        DeriveError::MissingField {
            source_name: self.source.clone(),
            model_type: self.model_type.clone(),
            field: field.to_string(),
            why,
        }
    }

    pub(crate) fn bad(&self, field: &str, expected: &'static str, found: &Value) -> DeriveError {
        DeriveError::BadField {
            source_name: self.source.clone(),
            field: field.to_string(),
            expected,
            found: found.to_string(),
        }
    }

    /// A positive integer field; `why` says what it decides.
    pub fn positive(&self, field: &str, why: &'static str) -> Result<u64, DeriveError> {
        self.opt_positive(field)?
            .ok_or_else(|| self.missing(field, why))
    }

    /// A positive integer field that may be absent.
    pub fn opt_positive(&self, field: &str) -> Result<Option<u64>, DeriveError> {
        match self.value(field) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(self.bad(field, "a positive integer", v)),
            },
        }
    }

    /// A non-negative integer field that may be absent.
    pub fn opt_count(&self, field: &str) -> Result<Option<u64>, DeriveError> {
        match self.value(field) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.bad(field, "a non-negative integer", v)),
        }
    }

    /// A number field (integer or float) that may be absent.
    pub fn opt_number(&self, field: &str) -> Result<Option<f64>, DeriveError> {
        match self.value(field) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .map(Some)
                .ok_or_else(|| self.bad(field, "a positive number", v)),
        }
    }

    /// A string field that may be absent.
    pub fn opt_str(&self, field: &str) -> Result<Option<&str>, DeriveError> {
        match self.value(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.bad(field, "a string", v)),
        }
    }

    /// A list of strings that may be absent.
    pub fn opt_str_list(&self, field: &str) -> Result<Option<Vec<String>>, DeriveError> {
        match self.value(field) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| i.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| {
                    self.bad(
                        field,
                        "a list of strings",
                        self.value(field).unwrap_or(&Value::Null),
                    )
                }),
            Some(v) => Err(self.bad(field, "a list of strings", v)),
        }
    }

    /// An object field (a nested table such as `linear_attn_config`).
    pub fn sub_config(&self, field: &str, why: &'static str) -> Result<HfConfig, DeriveError> {
        match self.value(field) {
            None => Err(self.missing(field, why)),
            Some(Value::Object(map)) => Ok(HfConfig {
                source: format!("{} ({field})", self.source),
                model_type: self.model_type.clone(),
                fields: map.clone(),
            }),
            Some(v) => Err(self.bad(field, "an object", v)),
        }
    }

    /// A list of layer indices that may be absent.
    pub fn opt_index_list(&self, field: &str) -> Result<Option<Vec<u64>>, DeriveError> {
        match self.value(field) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(Value::as_u64)
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| {
                    self.bad(
                        field,
                        "a list of layer indices",
                        &Value::Array(items.clone()),
                    )
                }),
            Some(v) => Err(self.bad(field, "a list of layer indices", v)),
        }
    }
}
