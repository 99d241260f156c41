//! Small Markdown helpers for the generated pages: table cells and inline code.

/// Text safe in one table cell: one line, pipes escaped.
pub fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// `text` as inline code, safe in a table cell (a backtick inside picks a longer fence).
pub fn code(text: &str) -> String {
    let text = text.replace('|', "\\|");
    if text.contains('`') {
        format!("`` {text} ``")
    } else {
        format!("`{text}`")
    }
}

/// A table with `header` and `rows`, each row as many cells as the header.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!("| {} |\n", header.join(" | "));
    out.push_str(&format!(
        "|{}\n",
        header.iter().map(|_| " --- |").collect::<String>()
    ));
    for row in rows {
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_one_line_and_pipes_do_not_split_them() {
        assert_eq!(cell("a |\n b"), "a \\| b");
        assert_eq!(code("x|y"), "`x\\|y`");
        assert_eq!(code("a`b"), "`` a`b ``");
        assert_eq!(
            table(&["a", "b"], &[vec!["1".into(), "2".into()]]),
            "| a | b |\n| --- | --- |\n| 1 | 2 |\n"
        );
    }
}
