//! What an error may quote of a client's text: a bounded prefix, so that no error grows with what
//! a client (or an upstream) sends.

/// The most characters of a client's text an error quotes.
pub const MAX_CHARS: usize = 64;

/// `text` quoted as `{:?}` would quote it, cut to [`MAX_CHARS`] characters and marked with its
/// length when cut.
pub fn quoted(text: &str) -> String {
    match text.char_indices().nth(MAX_CHARS) {
        None => format!("{text:?}"),
        Some((end, _)) => format!("{:?}… ({} bytes)", &text[..end], text.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_text_is_quoted_by_a_bounded_prefix() {
        assert_eq!(quoted("t-1"), "\"t-1\"");
        let long = "x".repeat(100_000);
        let quoted = quoted(&long);
        assert!(quoted.len() < 100, "{quoted}");
        assert!(quoted.ends_with("… (100000 bytes)"), "{quoted}");
        assert_eq!(super::quoted(&"é".repeat(65)).chars().filter(|c| *c == 'é').count(), 64, "cut on a character");
    }
}
