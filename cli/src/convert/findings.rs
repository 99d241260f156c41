//! What a conversion could not carry over, said once per field: the path in the earlier
//! manifest, and what to do. Errors stop the conversion (nothing is written); warnings
//! are fields without an equivalent (`--strict` makes them errors); notes say where a
//! behaviour changed although the field was carried over.

use std::fmt;

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Carried over, with a change worth knowing.
    Note,
    /// Not carried over: no equivalent here.
    Warning,
    /// The document cannot be converted as it is.
    Error,
}

/// One field's finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// How much it matters.
    pub severity: Severity,
    /// The field in the earlier manifest, e.g. `spec.services.prefill.args[3]`.
    pub path: String,
    /// What happened and what to do.
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Note => "note",
            Severity::Warning => "warning",
            Severity::Error => "error",
        };
        write!(f, "{level}: {}: {}", self.path, self.message)
    }
}

/// The findings of one document, in the order they were made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings(pub Vec<Finding>);

impl Findings {
    /// Adds a finding.
    pub fn push(
        &mut self,
        severity: Severity,
        path: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.0.push(Finding {
            severity,
            path: path.into(),
            message: message.into(),
        });
    }

    /// A field without an equivalent.
    pub fn warn(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.push(Severity::Warning, path, message);
    }

    /// A change in behaviour.
    pub fn note(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.push(Severity::Note, path, message);
    }

    /// Something that stops the conversion.
    pub fn error(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.push(Severity::Error, path, message);
    }

    /// The most severe finding, if any.
    pub fn worst(&self) -> Option<Severity> {
        self.0.iter().map(|f| f.severity).max()
    }
}
