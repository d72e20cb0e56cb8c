//! Escaping of untrusted text (messages, names, config values) for XML and HTML output.

/// Escapes text for an XML/HTML attribute value or element content.
///
/// `&`, `<`, `>`, `"` and `'` become entities; tab, newline and carriage return become
/// character references (so they survive attribute-value normalisation); other characters that
/// XML 1.0 forbids (C0 controls, U+FFFE, U+FFFF) become U+FFFD.
pub fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' => out.push_str("&#9;"),
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// Escapes text for XML element content, keeping newlines as they are (for multi-line bodies).
pub fn xml_body(text: &str) -> String {
    text.split('\n').map(xml).collect::<Vec<_>>().join("\n")
}

/// Escapes text for HTML (content or a quoted attribute), multi-line text kept as is.
///
/// Besides the usual entities, every `/` becomes `&#47;`: it renders the same, but the file
/// then never contains a literal `://` or `//`, so any URL that the run's config or messages
/// happen to contain is plainly text, and "the report has no network URL" stays checkable by
/// a plain search of the file.
pub fn html(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '/' => out.push_str("&#47;"),
            '\n' | '\t' => out.push(c),
            c if (c as u32) < 0x20 => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escapes_markup_quotes_and_controls() {
        assert_eq!(xml("a<b & \"c\" 'd'>\n\u{1}"), "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;&#10;\u{FFFD}");
    }

    #[test]
    fn html_breaks_urls() {
        assert_eq!(html("<a href=\"http://x\">"), "&lt;a href=&quot;http:&#47;&#47;x&quot;&gt;");
    }
}
