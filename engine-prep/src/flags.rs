//! Reading engine flags as the engines' argument parsers do.

/// The value of `flag` (`--flag value` or `--flag=value`), last one winning.
pub fn flag_value<'a>(args: &'a [String], names: &[&str]) -> Option<&'a str> {
    let mut found = None;
    for (i, a) in args.iter().enumerate() {
        for name in names {
            if a == name {
                found = args.get(i + 1).map(String::as_str);
            } else if let Some(v) = a.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
                found = Some(v);
            }
        }
    }
    found
}

/// Whether `flag` is given, with or without a value.
pub fn has_flag(args: &[String], flag: &str) -> bool {
    flag_value(args, &[flag]).is_some() || args.iter().any(|a| a == flag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_spellings_and_the_last_one_wins() {
        let args: Vec<String> = ["--port", "1", "--port=2", "--flag"]
            .map(String::from)
            .to_vec();
        assert_eq!(flag_value(&args, &["--port"]), Some("2"));
        assert_eq!(flag_value(&args, &["--model"]), None);
        assert!(has_flag(&args, "--flag") && has_flag(&args, "--port"));
        assert!(!has_flag(&args, "--po"));
    }
}
