//! Reversible percent-escaping of the few characters a server's key syntax reserves, so that a
//! lock name can be stored inside a key and read back from it.

/// `text` with `%` and each of `reserved` (ASCII characters) written as `%XX` (upper-case hex),
/// and everything else as it is: reversible with [`unescape`], and free of `reserved`.
pub fn escape(text: &str, reserved: &[char]) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '%' || reserved.contains(&c) {
            out.push_str(&format!("%{:02X}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// The inverse of [`escape`] with the same `reserved`; `None` for text it cannot have produced
/// (a bare reserved character, or an escape of anything else).
pub fn unescape(text: &str, reserved: &[char]) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(|c: char| c == '%' || reserved.contains(&c)) {
        out.push_str(&rest[..i]);
        let hex = rest.get(i..i + 3)?.strip_prefix('%')?;
        if hex.bytes().any(|b| b.is_ascii_lowercase()) {
            return None;
        }
        let c = char::from(u8::from_str_radix(hex, 16).ok()?);
        if c != '%' && !reserved.contains(&c) {
            return None;
        }
        out.push(c);
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_is_reversible_and_leaves_no_reserved_character() {
        let reserved = ['{', '}', '/'];
        for name in ["plain", "a/b", "{tag}", "100%", "%7B", "ü/{%}", ""] {
            let escaped = escape(name, &reserved);
            assert!(!escaped.contains(reserved), "{escaped}");
            assert_eq!(unescape(&escaped, &reserved).as_deref(), Some(name));
        }
        assert_eq!(escape("a/b%{", &['/', '{']), "a%2Fb%25%7B");
    }

    #[test]
    fn text_escape_cannot_produce_is_refused() {
        let reserved = ['/'];
        for bad in ["a/b", "%", "%2", "%41", "%2f", "%zz"] {
            assert_eq!(unescape(bad, &reserved), None, "{bad}");
        }
    }
}
