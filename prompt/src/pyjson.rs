//! Python's `json.dumps(obj, ensure_ascii=False)` output, which chat templates embed
//! through `tojson`. Differences from compact JSON: `", "` and `": "` separators (or
//! `","` with an indent), non-ASCII characters written as they are, and Python's set of
//! escapes. A template difference here changes the prompt's tokens and silently zeroes
//! the prefix-cache hit rate, so this is pinned against Python in tests.

use serde_json::Value;
use std::fmt::Write;

/// Formats `value` as `json.dumps(value, ensure_ascii=False, indent=indent)` does.
pub fn dumps(value: &Value, indent: Option<usize>) -> String {
    let mut out = String::new();
    write_value(&mut out, value, indent, 0);
    out
}

fn write_value(out: &mut String, value: &Value, indent: Option<usize>, level: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                separator(out, i, indent, level + 1);
                write_value(out, item, indent, level + 1);
            }
            close(out, indent, level);
            out.push(']');
        }
        Value::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                separator(out, i, indent, level + 1);
                write_string(out, key);
                out.push_str(": ");
                write_value(out, item, indent, level + 1);
            }
            close(out, indent, level);
            out.push('}');
        }
    }
}

fn separator(out: &mut String, index: usize, indent: Option<usize>, level: usize) {
    match indent {
        None if index > 0 => out.push_str(", "),
        None => {}
        Some(width) => {
            if index > 0 {
                out.push(',');
            }
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', width * level));
        }
    }
}

fn close(out: &mut String, indent: Option<usize>, level: usize) {
    if let Some(width) = indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', width * level));
    }
}

fn write_number(out: &mut String, n: &serde_json::Number) {
    if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
        // Python's float repr: integral floats keep ".0"; exponents are written e+NN.
        if f.is_finite() && f == f.trunc() && f.abs() < 1e16 {
            let _ = write!(out, "{f:.1}");
        } else {
            let text = format!("{f:?}");
            match text.split_once('e') {
                Some((mantissa, exp)) if !exp.starts_with('-') => {
                    let _ = write!(out, "{mantissa}e+{exp:0>2}");
                }
                Some((mantissa, exp)) => {
                    let _ = write!(out, "{mantissa}e-{:0>2}", &exp[1..]);
                }
                None => out.push_str(&text),
            }
        }
    } else {
        let _ = write!(out, "{n}");
    }
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn matches_python_json_dumps() {
        // Each expectation printed by Python 3.11: json.dumps(v, ensure_ascii=False[, indent=...]).
        let v = json!({"name": "get_weather", "b": [1, 2.5, true, null], "ü": "ñ\n\"\\\t\u{1}", "e": {}, "f": []});
        assert_eq!(
            dumps(&v, None),
            r#"{"name": "get_weather", "b": [1, 2.5, true, null], "ü": "ñ\n\"\\\t\u0001", "e": {}, "f": []}"#
        );
        assert_eq!(
            dumps(&json!({"a": [1, {"b": 2}], "c": "x"}), Some(4)),
            "{\n    \"a\": [\n        1,\n        {\n            \"b\": 2\n        }\n    ],\n    \"c\": \"x\"\n}"
        );
        assert_eq!(dumps(&json!(3.0), None), "3.0");
        assert_eq!(dumps(&json!(1e20), None), "1e+20");
        assert_eq!(dumps(&json!(1.5e-7), None), "1.5e-07");
        assert_eq!(dumps(&json!("你好🦄"), None), "\"你好🦄\"");
    }
}
