//! The Jinja environment chat templates are written for: `transformers` renders them
//! with `trim_blocks`, `lstrip_blocks`, the loop-controls extension, Python's string
//! and dict methods, and the globals `raise_exception` and `strftime_now`; its `tojson`
//! is `json.dumps` with `ensure_ascii=False` and key order kept.

use crate::pyjson;
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use std::time::{SystemTime, UNIX_EPOCH};

/// Name a lone chat template is registered under by [`build_environment`].
pub const CHAT_TEMPLATE: &str = "chat";

/// An environment holding one chat template, as [`CHAT_TEMPLATE`].
pub fn build_environment(template: &str) -> Result<Environment<'static>, Error> {
    build_named_environment([(CHAT_TEMPLATE, template)])
}

/// An environment holding each of `templates` under its name (a model's named chat
/// templates: `default`, `tool_use`, ...).
pub fn build_named_environment<'a>(
    templates: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    for (name, template) in templates {
        env.add_template_owned(name.to_owned(), template.to_owned())?;
    }
    Ok(env)
}

fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from_safe_string(pyjson::dumps(&json, indent)))
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)` with the directives chat templates use (`%d %b %Y`, `%B`,
/// `%m`, `%y`, `%A`, `%a`, `%H`, `%M`, `%S`, `%%`), in UTC.
fn strftime_now(format: String) -> Result<Value, Error> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Ok(Value::from(format_time(secs, &format)))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
];

/// Formats Unix time `secs` (UTC) with strftime directives.
pub fn format_time(secs: i64, format: &str) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('a') => out.push_str(&weekday[..3]),
            Some('A') => out.push_str(weekday),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem % 3600 / 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_dates_like_strftime() {
        // 2026-11-30 02:26:27 UTC was a Monday.
        let t = 1_796_005_587;
        assert_eq!(format_time(t, "%d %b %Y"), "30 Nov 2026");
        assert_eq!(
            format_time(t, "%A %B %m/%y %H:%M:%S %%"),
            "Monday November 11/26 02:26:27 %"
        );
        assert_eq!(format_time(0, "%Y-%m-%d %a"), "1970-01-01 Thu");
        assert_eq!(format_time(951_782_400, "%Y-%m-%d"), "2000-02-29");
    }

    #[test]
    fn python_methods_and_tojson_render() {
        let env = build_environment(
            "{% for m in messages %}{% if m.content.startswith('x') %}{% continue %}{% endif %}\
             {{ m.content.strip() | upper }}|{{ m | tojson }}\n{% endfor %}",
        )
        .unwrap();
        let messages =
            serde_json::json!([{"role": "user", "content": " héllo "}, {"content": "xskip"}]);
        let out = env
            .get_template(CHAT_TEMPLATE)
            .unwrap()
            .render(minijinja::context!(messages => Value::from_serialize(&messages)))
            .unwrap();
        assert_eq!(
            out,
            "HÉLLO|{\"role\": \"user\", \"content\": \" héllo \"}\n"
        );
    }

    #[test]
    fn raise_exception_fails_rendering_with_its_message() {
        let env =
            build_environment("{{ raise_exception('only user and assistant roles') }}").unwrap();
        let err = env
            .get_template(CHAT_TEMPLATE)
            .unwrap()
            .render(())
            .unwrap_err();
        assert!(
            err.to_string().contains("only user and assistant roles"),
            "{err}"
        );
    }
}
