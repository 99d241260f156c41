//! What the earlier server's Python said about its input, restated (pure): the control
//! endpoints the gateway took over from it answer a bad request with the text Python
//! produced, so a script that matched on it still matches.
//!
//! - [`json_error`]: `json.loads`' `JSONDecodeError` message (the C scanner of CPython
//!   3.10 to 3.12: the message, then `line L column C (char N)`, positions in code
//!   points).
//! - [`fromhex`]: `bytes.fromhex`, whitespace between bytes allowed, and its error.
//! - [`int_of`]: `int(x)` of a JSON value: ints, bools, floats truncated, decimal strings
//!   with whitespace, a sign and single underscores; its `TypeError`/`ValueError` text.
//! - [`repr`]: `repr()` of a JSON value as Python holds it (`'text'`, `True`, `None`,
//!   `2.5`, `[1, 2]`, `{'a': 1}`).
//!
//! Each is checked against the earlier server's own answers in
//! `gateway/testdata/earlier_server/fixtures.json`, and against CPython in the tests here.

use serde_json::Value;

/// Nesting past this is refused with a generic message (CPython would have run out of
/// recursion long before answering).
const MAX_DEPTH: usize = 512;

/// The message `json.loads(text)` raises for `text` (`None`: Python parses it).
pub(crate) fn json_error(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut scan = Scanner {
        s: &chars,
        depth: 0,
    };
    let at = scan.ws(0);
    let failure = match scan.value(at) {
        Err(e) => e,
        Ok(end) => {
            let end = scan.ws(end);
            if end == chars.len() {
                return None;
            }
            ("Extra data", end)
        }
    };
    let (message, pos) = failure;
    let before = &chars[..pos];
    let line = before.iter().filter(|c| **c == '\n').count() + 1;
    let column = match before.iter().rposition(|c| *c == '\n') {
        Some(newline) => pos - newline,
        None => pos + 1,
    };
    Some(format!(
        "{message}: line {line} column {column} (char {pos})"
    ))
}

type Scan = Result<usize, (&'static str, usize)>;

struct Scanner<'a> {
    s: &'a [char],
    depth: usize,
}

impl Scanner<'_> {
    fn at(&self, i: usize) -> Option<char> {
        self.s.get(i).copied()
    }

    fn ws(&self, mut i: usize) -> usize {
        while matches!(self.at(i), Some(' ' | '\t' | '\n' | '\r')) {
            i += 1;
        }
        i
    }

    fn literal(&self, i: usize, word: &str) -> bool {
        word.chars()
            .enumerate()
            .all(|(k, c)| self.at(i + k) == Some(c))
    }

    fn value(&mut self, i: usize) -> Scan {
        const EXPECTING: &str = "Expecting value";
        match self.at(i) {
            None => Err((EXPECTING, i)),
            Some('"') => self.string(i + 1),
            Some('{') | Some('[') if self.depth >= MAX_DEPTH => Err(("Nested too deeply", i)),
            Some('{') => {
                self.depth += 1;
                let r = self.object(i + 1);
                self.depth -= 1;
                r
            }
            Some('[') => {
                self.depth += 1;
                let r = self.array(i + 1);
                self.depth -= 1;
                r
            }
            Some('n') if self.literal(i, "null") => Ok(i + 4),
            Some('t') if self.literal(i, "true") => Ok(i + 4),
            Some('f') if self.literal(i, "false") => Ok(i + 5),
            Some('N') if self.literal(i, "NaN") => Ok(i + 3),
            Some('I') if self.literal(i, "Infinity") => Ok(i + 8),
            Some('-') if self.literal(i, "-Infinity") => Ok(i + 9),
            Some(_) => self.number(i).ok_or((EXPECTING, i)),
        }
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?`, the end of the longest match.
    fn number(&self, start: usize) -> Option<usize> {
        let digit = |i: usize| self.at(i).is_some_and(|c| c.is_ascii_digit());
        let mut i = start;
        if self.at(i) == Some('-') {
            i += 1;
        }
        match self.at(i) {
            Some('0') => i += 1,
            Some('1'..='9') => {
                while digit(i) {
                    i += 1;
                }
            }
            _ => return None,
        }
        if self.at(i) == Some('.') && digit(i + 1) {
            i += 1;
            while digit(i) {
                i += 1;
            }
        }
        if matches!(self.at(i), Some('e' | 'E')) {
            let mut j = i + 1;
            if matches!(self.at(j), Some('+' | '-')) {
                j += 1;
            }
            if digit(j) {
                while digit(j) {
                    j += 1;
                }
                i = j;
            }
        }
        Some(i)
    }

    /// A string whose opening quote is at `i - 1`; the index after its closing quote.
    fn string(&self, mut i: usize) -> Scan {
        let begin = i - 1;
        let unterminated = ("Unterminated string starting at", begin);
        loop {
            match self.at(i) {
                None => return Err(unterminated),
                Some('"') => return Ok(i + 1),
                Some('\\') => {
                    let escape = i + 1;
                    match self.at(escape) {
                        None => return Err(unterminated),
                        Some('u') => {
                            let digits = escape + 1;
                            if digits + 4 >= self.s.len() {
                                return Err(("Invalid \\uXXXX escape", escape));
                            }
                            if !(digits..digits + 4)
                                .all(|k| self.at(k).is_some_and(|c| c.is_ascii_hexdigit()))
                            {
                                return Err(("Invalid \\uXXXX escape", escape));
                            }
                            i = digits + 4;
                        }
                        Some('"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't') => i = escape + 1,
                        Some(_) => return Err(("Invalid \\escape", i)),
                    }
                }
                Some(c) if (c as u32) < 0x20 => return Err(("Invalid control character at", i)),
                Some(_) => i += 1,
            }
        }
    }

    fn object(&mut self, i: usize) -> Scan {
        const NAME: &str = "Expecting property name enclosed in double quotes";
        let mut i = self.ws(i);
        if self.at(i) == Some('}') {
            return Ok(i + 1);
        }
        loop {
            if self.at(i) != Some('"') {
                return Err((NAME, i));
            }
            i = self.ws(self.string(i + 1)?);
            if self.at(i) != Some(':') {
                return Err(("Expecting ':' delimiter", i));
            }
            let end = self.value(self.ws(i + 1))?;
            i = self.ws(end);
            match self.at(i) {
                Some('}') => return Ok(i + 1),
                Some(',') => i = self.ws(i + 1),
                _ => return Err(("Expecting ',' delimiter", i)),
            }
        }
    }

    fn array(&mut self, i: usize) -> Scan {
        let mut i = self.ws(i);
        if self.at(i) == Some(']') {
            return Ok(i + 1);
        }
        loop {
            let end = self.value(i)?;
            i = self.ws(end);
            match self.at(i) {
                Some(']') => return Ok(i + 1),
                Some(',') => i = self.ws(i + 1),
                _ => return Err(("Expecting ',' delimiter", i)),
            }
        }
    }
}

/// `bytes.fromhex(s)`: pairs of hex digits, ASCII whitespace allowed before each pair;
/// the error names the code point where a digit was expected.
pub(crate) fn fromhex(s: &str) -> Result<Vec<u8>, String> {
    let chars: Vec<char> = s.chars().collect();
    let error =
        |at: usize| format!("non-hexadecimal number found in fromhex() arg at position {at}");
    let digit = |i: usize| chars.get(i).and_then(|c| c.to_digit(16));
    let mut out = Vec::with_capacity(chars.len() / 2);
    let mut i = 0;
    while i < chars.len() {
        if matches!(chars[i], ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c') {
            i += 1;
            continue;
        }
        let high = digit(i).ok_or_else(|| error(i))?;
        let low = digit(i + 1).ok_or_else(|| error(i + 1))?;
        out.push((high * 16 + low) as u8);
        i += 2;
    }
    Ok(out)
}

/// A Python `int` parsed from a decimal string as `int(str)` does: surrounding whitespace,
/// an optional sign, digits with single underscores between them.
fn int_of_str(s: &str) -> Option<i128> {
    let t = s.trim();
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
        || !digits.chars().all(|c| c.is_ascii_digit() || c == '_')
    {
        return None;
    }
    let mut n: i128 = 0;
    for c in digits.chars().filter(|c| *c != '_') {
        n = n
            .saturating_mul(10)
            .saturating_add(i128::from(c.to_digit(10)?));
    }
    Some(if negative { -n } else { n })
}

/// `int(value)` of a JSON value as Python holds it, or the text of the `TypeError` or
/// `ValueError` it raises.
pub(crate) fn int_of(value: &Value) -> Result<i128, String> {
    let type_error = |name: &str| {
        format!(
            "int() argument must be a string, a bytes-like object or a real number, not '{name}'"
        )
    };
    match value {
        Value::Bool(b) => Ok(i128::from(*b)),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Ok(i128::from(i)),
            (_, Some(u), _) => Ok(i128::from(u)),
            // Truncated toward zero, as int(float) does.
            (_, _, Some(f)) => Ok(f.trunc() as i128),
            _ => Err(type_error("float")),
        },
        Value::String(s) => int_of_str(s)
            .ok_or_else(|| format!("invalid literal for int() with base 10: {}", repr_str(s))),
        Value::Null => Err(type_error("NoneType")),
        Value::Array(_) => Err(type_error("list")),
        Value::Object(_) => Err(type_error("dict")),
    }
}

/// `repr()` of a Python `str`: single quotes unless the text holds one and no double
/// quote; backslashes, quotes and control characters escaped.
pub(crate) fn repr_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// `repr()` of a Python `float`: the shortest digits that read back, in positional
/// notation for exponents from -4 to 15 (with `.0` when whole), else `1e+16`, `1e-05`.
pub(crate) fn repr_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Rust's `{:e}` is the shortest round-trip form: `d.ddde<exp>`.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if negative { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let point = exp + 1;
        let text = if point <= 0 {
            format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{int}.{frac}")
        };
        format!("{sign}{text}")
    } else {
        let (first, rest) = digits.split_at(1);
        let mantissa = if rest.is_empty() {
            first.to_owned()
        } else {
            format!("{first}.{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{esign}{:02}", exp.unsigned_abs())
    }
}

/// `repr()` of a JSON value as Python's `json.loads` gives it.
pub(crate) fn repr(value: &Value) -> String {
    match value {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (_, Some(u), _) => u.to_string(),
            (_, _, Some(f)) => repr_float(f),
            _ => n.to_string(),
        },
        Value::String(s) => repr_str(s),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(repr).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", repr_str(k), repr(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_errors_read_as_cpythons() {
        // From CPython 3.11's json.loads.
        for (text, message) in [
            ("", "Expecting value: line 1 column 1 (char 0)"),
            (" ", "Expecting value: line 1 column 2 (char 1)"),
            (
                "{",
                "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
            ),
            (
                "{\"a\"",
                "Expecting ':' delimiter: line 1 column 5 (char 4)",
            ),
            ("{\"a\":", "Expecting value: line 1 column 6 (char 5)"),
            (
                "{\"a\":1",
                "Expecting ',' delimiter: line 1 column 7 (char 6)",
            ),
            (
                "{\"a\":1,}",
                "Expecting property name enclosed in double quotes: line 1 column 8 (char 7)",
            ),
            ("[1,]", "Expecting value: line 1 column 4 (char 3)"),
            ("[1 2]", "Expecting ',' delimiter: line 1 column 4 (char 3)"),
            (
                "\"abc",
                "Unterminated string starting at: line 1 column 1 (char 0)",
            ),
            ("\"a\\x\"", "Invalid \\escape: line 1 column 3 (char 2)"),
            (
                "\"a\\u12\"",
                "Invalid \\uXXXX escape: line 1 column 4 (char 3)",
            ),
            (
                "\"a\nb\"",
                "Invalid control character at: line 1 column 3 (char 2)",
            ),
            ("nul", "Expecting value: line 1 column 1 (char 0)"),
            ("01", "Extra data: line 1 column 2 (char 1)"),
            ("1e+", "Extra data: line 1 column 2 (char 1)"),
            ("-", "Expecting value: line 1 column 1 (char 0)"),
            (
                "\n\n  {",
                "Expecting property name enclosed in double quotes: line 3 column 4 (char 5)",
            ),
            ("é{", "Expecting value: line 1 column 1 (char 0)"),
            (
                "[\"a\\",
                "Unterminated string starting at: line 1 column 2 (char 1)",
            ),
            ("[1,\n2,]", "Expecting value: line 2 column 3 (char 6)"),
            ("[-]", "Expecting value: line 1 column 2 (char 1)"),
        ] {
            assert_eq!(json_error(text).as_deref(), Some(message), "{text:?}");
        }
        for valid in [
            "NaN",
            "-Infinity",
            "\"\\ud800\"",
            "-0",
            "{\"a\": [1, 2.5e3]}",
        ] {
            assert_eq!(json_error(valid), None, "{valid:?}");
        }
    }

    #[test]
    fn fromhex_as_python() {
        assert_eq!(fromhex(" 00 11\t22 ").unwrap(), vec![0, 0x11, 0x22]);
        for (text, at) in [("00zz", 2), ("001", 3), ("0 011", 1), ("00é1", 2)] {
            assert_eq!(
                fromhex(text).unwrap_err(),
                format!("non-hexadecimal number found in fromhex() arg at position {at}"),
                "{text:?}"
            );
        }
    }

    #[test]
    fn int_as_python() {
        for (value, n) in [
            (json!(5), 5),
            (json!(true), 1),
            (json!(false), 0),
            (json!(2.7), 2),
            (json!(-2.7), -2),
            (json!(" 250 "), 250),
            (json!("+1_000"), 1000),
            (json!("-0"), 0),
        ] {
            assert_eq!(int_of(&value), Ok(n), "{value}");
        }
        for (value, message) in [
            (
                json!("soon"),
                "invalid literal for int() with base 10: 'soon'",
            ),
            (
                json!("it's \\ late"),
                "invalid literal for int() with base 10: \"it's \\\\ late\"",
            ),
            (json!("1_"), "invalid literal for int() with base 10: '1_'"),
            (
                json!("5.0"),
                "invalid literal for int() with base 10: '5.0'",
            ),
            (
                json!(null),
                "int() argument must be a string, a bytes-like object or a real number, not 'NoneType'",
            ),
            (
                json!([5]),
                "int() argument must be a string, a bytes-like object or a real number, not 'list'",
            ),
        ] {
            assert_eq!(int_of(&value).unwrap_err(), message, "{value}");
        }
    }

    #[test]
    fn repr_as_python() {
        for (value, text) in [
            (json!("4"), "'4'"),
            (json!(2.5), "2.5"),
            (json!(3.0), "3.0"),
            (json!(1e16), "1e+16"),
            (json!(1.5e-5), "1.5e-05"),
            (json!(0.0001), "0.0001"),
            (json!(123456789012345.6), "123456789012345.6"),
            (json!(true), "True"),
            (json!(null), "None"),
            (json!([1, "a"]), "[1, 'a']"),
            (json!({"replicas": "x"}), "{'replicas': 'x'}"),
            (json!("a'b"), "\"a'b\""),
            (json!("a'b\""), "'a\\'b\"'"),
            (json!("tab\there"), "'tab\\there'"),
        ] {
            assert_eq!(repr(&value), text, "{value}");
        }
    }
}
