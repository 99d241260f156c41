//! The wire contracts, from `infera-proto`, the crate that holds them once (no I/O):
//! the worker record's fields with their doc comments, the error classes and what each
//! answers, and every module's public constants (header names, etcd keys, NATS subjects
//! and streams, timeouts, environment variables) with their docs and values. Read from
//! the crate's sources, so a constant added there is listed here at the next `infera
//! docs`.

use super::Page;
use super::markdown::{cell, code, table};
use anyhow::{Context, Result};
use infera_proto::error_class::ErrorClass;
use std::path::Path;

/// The structs of `worker.rs` whose fields are the record's.
const RECORD_STRUCTS: &[(&str, &str)] = &[
    ("WorkerRecord", "The worker record"),
    ("KvInfo", "The record's `kv` block"),
];

/// The contracts page, from the sources under `proto_src`.
pub fn page(proto_src: &Path) -> Result<Page> {
    let read = |name: &str| {
        std::fs::read_to_string(proto_src.join(name))
            .with_context(|| format!("reading {}", proto_src.join(name).display()))
    };
    let mut out = String::from(
        "# Wire contracts\n\n\
         What Infera's parts say to each other and to the earlier system's, kept byte for \
         byte: every contract lives once in the `infera-proto` crate and is pinned by \
         fixtures made independently in `proto/testdata/`. This page is read from that \
         crate's sources.\n\n",
    );
    let worker = read("worker.rs")?;
    for (name, title) in RECORD_STRUCTS {
        out.push_str(&format!("## {title} (`{name}`)\n\n"));
        let fields = struct_fields(&worker, name);
        let rows: Vec<Vec<String>> = fields
            .iter()
            .map(|f| vec![code(&f.name), code(&f.ty), cell(&f.doc)])
            .collect();
        out.push_str(&table(&["field", "type", "meaning"], &rows));
        out.push('\n');
    }
    out.push_str(
        "## Error classes\n\n\
         Every error the gateway answers is one of these, rendered once as OpenAI's or \
         Anthropic's error JSON (`{\"error\": {\"message\", \"type\", \"param\", \"code\"}}`).\n\n",
    );
    let rows: Vec<Vec<String>> = ErrorClass::ALL
        .iter()
        .map(|c| {
            vec![
                code(&format!("{c:?}")),
                c.status().to_string(),
                code(c.openai_type()),
                c.default_code().map(code).unwrap_or_default(),
                code(c.anthropic_type()),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "class",
            "status",
            "OpenAI `type`",
            "OpenAI `code`",
            "Anthropic `type`",
        ],
        &rows,
    ));
    out.push('\n');
    let mut files: Vec<_> = std::fs::read_dir(proto_src)
        .with_context(|| format!("listing {}", proto_src.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".rs") && n != "lib.rs")
        .collect();
    files.sort();
    out.push_str("## Constants, by module\n\n");
    for file in files {
        let text = read(&file)?;
        let consts = constants(&text);
        if consts.is_empty() {
            continue;
        }
        let module = file.trim_end_matches(".rs");
        out.push_str(&format!("### `infera_proto::{module}`\n\n"));
        let doc = module_doc(&text);
        if !doc.is_empty() {
            out.push_str(&format!("{doc}\n\n"));
        }
        let rows: Vec<Vec<String>> = consts
            .iter()
            .map(|c| vec![code(&c.name), value_cell(&c.value), cell(&c.doc)])
            .collect();
        out.push_str(&table(&["constant", "value", "meaning"], &rows));
        out.push('\n');
    }
    Ok(Page {
        file: "contracts.md",
        text: out,
    })
}

/// A documented item read from source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// Its name.
    pub name: String,
    /// A field's type (empty for a constant).
    pub ty: String,
    /// A constant's value as written (empty for a field).
    pub value: String,
    /// Its doc comment, joined into one paragraph (intra-doc link brackets kept as code).
    pub doc: String,
}

/// The first paragraph of a module's `//!` docs (pure).
pub fn module_doc(text: &str) -> String {
    let mut lines = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("//!") else {
            break;
        };
        let rest = rest.trim();
        if rest.is_empty() {
            if !lines.is_empty() {
                break;
            }
            continue;
        }
        lines.push(rest);
    }
    unlink(&lines.join(" "))
}

/// Top-level `pub const` items with their doc comments and values (pure).
pub fn constants(text: &str) -> Vec<Item> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut doc: Vec<&str> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.starts_with("#[cfg(test)]") {
            break;
        }
        if let Some(d) = line.strip_prefix("///") {
            doc.push(d.trim());
        } else if let Some(rest) = line.strip_prefix("pub const ") {
            let mut decl = rest.to_owned();
            while !decl.trim_end().ends_with(';') && i + 1 < lines.len() {
                i += 1;
                decl.push('\n');
                decl.push_str(lines[i].trim());
            }
            if let Some((head, value)) = decl.split_once('=') {
                let name = head.split(':').next().unwrap_or_default().trim();
                out.push(Item {
                    name: name.to_owned(),
                    ty: String::new(),
                    value: value.trim().trim_end_matches(';').trim().to_owned(),
                    doc: unlink(&doc.join(" ")),
                });
            }
            doc.clear();
        } else if !line.starts_with("#[") {
            doc.clear();
        }
        i += 1;
    }
    out
}

/// The fields of `pub struct name` with their doc comments and serde notes (pure).
pub fn struct_fields(text: &str, name: &str) -> Vec<Item> {
    let start = format!("pub struct {name} {{");
    let Some(pos) = text.find(&start) else {
        return Vec::new();
    };
    let body = &text[pos + start.len()..];
    let body = &body[..body.find("\n}").unwrap_or(body.len())];
    let mut out = Vec::new();
    let mut doc: Vec<&str> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    for line in body.lines().map(str::trim) {
        if let Some(d) = line.strip_prefix("///") {
            doc.push(d.trim());
        } else if line.starts_with("#[serde(") {
            if line.contains("flatten") {
                notes.push("Its keys sit at the record's top level.".into());
            }
            if line.contains("skip_serializing_if") {
                notes.push("Written only when set.".into());
            }
        } else if let Some(rest) = line.strip_prefix("pub ") {
            if let Some((field, ty)) = rest.split_once(':') {
                let mut text = unlink(&doc.join(" "));
                for n in &notes {
                    text = format!("{text} {n}");
                }
                out.push(Item {
                    name: field.trim().to_owned(),
                    ty: ty.trim().trim_end_matches(',').to_owned(),
                    value: String::new(),
                    doc: text,
                });
            }
            doc.clear();
            notes.clear();
        }
    }
    out
}

/// Rustdoc's intra-doc links (`[`x`]`, `[x](y)` to items) as plain code.
fn unlink(text: &str) -> String {
    text.replace("[`", "`").replace("`]", "`")
}

/// A value cell: long values cut at 80 characters.
fn value_cell(value: &str) -> String {
    let one_line = value.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() > 80 {
        let cut: String = one_line.chars().take(77).collect();
        code(&format!("{cut}..."))
    } else {
        code(&one_line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = "//! Fixture contracts for a test.\n//! Second line.\n//!\n//! Not this.\n\n\
        /// The fixture header ([`other`]).\npub const FIXTURE_HEADER: &str = \"x-fixture\";\n\n\
        /// Spans\n/// lines.\n#[doc(hidden)]\npub const LONG: u32 =\n    7;\n\nconst PRIVATE: u8 = 1;\n\n\
        /// A record.\npub struct Fixture {\n    /// Its id.\n    pub id: String,\n    /// Extra.\n    \
        #[serde(flatten)]\n    pub extra: Map<String, Value>,\n}\n\n#[cfg(test)]\nmod tests {\n    \
        /// Not listed.\n    pub const IN_TESTS: u8 = 2;\n}\n";

    #[test]
    fn constants_fields_and_module_docs_are_read() {
        assert_eq!(
            module_doc(SOURCE),
            "Fixture contracts for a test. Second line."
        );
        let c = constants(SOURCE);
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(c[0].name, "FIXTURE_HEADER");
        assert_eq!(c[0].value, "\"x-fixture\"");
        assert_eq!(c[0].doc, "The fixture header (`other`).");
        assert_eq!(
            (c[1].name.as_str(), c[1].value.as_str(), c[1].doc.as_str()),
            ("LONG", "7", "Spans lines.")
        );
        let f = struct_fields(SOURCE, "Fixture");
        assert_eq!(f.len(), 2);
        assert_eq!((f[0].name.as_str(), f[0].ty.as_str()), ("id", "String"));
        assert_eq!(f[1].doc, "Extra. Its keys sit at the record's top level.");
    }

    #[test]
    fn the_real_contracts_list_the_record_and_the_headers() {
        let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/src");
        let page = page(&proto).unwrap();
        assert!(
            page.text.contains("| `worker_id` | `String` |"),
            "{}",
            page.text
        );
        assert!(
            page.text
                .contains("`DRAIN_TOKEN_HEADER` | `\"x-infera-drain-token\"`"),
            "{}",
            page.text
        );
        assert!(
            page.text.contains("| `RateLimited` | 429 |"),
            "{}",
            page.text
        );
    }
}
