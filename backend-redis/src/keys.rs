//! Where a lock lives in Redis: key and channel names.
//!
//! Every key of one name shares the hash tag `{<encoded name>}`, so the scripts, which touch the
//! lock hash, the semaphore's keys and the fencing counter together, run unchanged on Redis
//! Cluster. The encoding percent-escapes only `{`, `}` and `%`: it is reversible, keeps names
//! readable in `redis-cli`, and guarantees the tag ends where the name ends.

use distlock_api::backend::{escape, unescape};
use distlock_api::{Error, LockName, Result};

/// The longest key prefix accepted.
pub(crate) const MAX_PREFIX_LEN: usize = 64;

/// Builds the key and channel names of locks under one prefix.
#[derive(Clone, Debug)]
pub(crate) struct KeySpace {
    prefix: String,
}

impl KeySpace {
    /// A key space under `prefix` (already validated by [`check_prefix`]).
    pub(crate) fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
        }
    }

    fn tagged(&self, name: &str, suffix: &str) -> String {
        format!("{}:{{{}}}:{suffix}", self.prefix, encode(name))
    }

    /// The hash holding `name`'s owner → hold count, `#token`, `#since`, (RedLock) `#fence`
    /// and an election leader's `#value`.
    pub(crate) fn lock_key(&self, name: &LockName) -> String {
        self.tagged(name.as_str(), "lock")
    }

    /// `name`'s fencing counter, which is never deleted.
    pub(crate) fn fence_key(&self, name: &LockName) -> String {
        self.tagged(name.as_str(), "fence")
    }

    /// The sorted set of `name`'s permit holders (owner ids scored by lease expiry), while it is
    /// held as a semaphore of several permits.
    pub(crate) fn holders_key(&self, name: &LockName) -> String {
        self.tagged(name.as_str(), "permits")
    }

    /// The hash of `name`'s semaphore: `#max` and owner → `token:hold count:since`.
    pub(crate) fn semaphore_key(&self, name: &LockName) -> String {
        self.tagged(name.as_str(), "semaphore")
    }

    /// The channel a release of `name` is published on.
    pub(crate) fn channel(&self, name: &LockName) -> String {
        self.tagged(name.as_str(), "released")
    }

    /// A `SCAN MATCH` / `PUBSUB CHANNELS` pattern for every key or channel of names starting
    /// with `name_prefix`.
    pub(crate) fn pattern(&self, name_prefix: &str) -> String {
        format!(
            "{}:{{{}*",
            glob_escape(&self.prefix),
            glob_escape(&encode(name_prefix))
        )
    }

    /// The lock name a key or channel of this key space belongs to, and the key's kind (`lock`,
    /// `fence`, `permits`, `semaphore`, `released`).
    pub(crate) fn parse<'a>(&self, key: &'a str) -> Option<(String, &'a str)> {
        let rest = key.strip_prefix(self.prefix.as_str())?.strip_prefix(":{")?;
        let (encoded, kind) = rest.split_once("}:")?;
        Some((decode(encoded)?, kind))
    }
}

/// Rejects a prefix that would break the hash tag or be unreadable.
pub(crate) fn check_prefix(prefix: &str) -> Result<()> {
    let bad = |c: char| c == '{' || c == '}' || c.is_control() || c.is_whitespace();
    if prefix.is_empty() || prefix.len() > MAX_PREFIX_LEN || prefix.chars().any(bad) {
        return Err(Error::invalid(format!(
            "key prefix {prefix:?} must be 1..={MAX_PREFIX_LEN} bytes without braces, whitespace \
             or control characters"
        )));
    }
    Ok(())
}

/// Percent-escapes `{`, `}` and `%`; everything else is kept as is.
pub(crate) fn encode(name: &str) -> String {
    escape(name, &['{', '}'])
}

/// The inverse of [`encode`]; `None` for text `encode` cannot produce.
pub(crate) fn decode(encoded: &str) -> Option<String> {
    unescape(encoded, &['{', '}'])
}

/// Escapes the characters `SCAN MATCH` and `PUBSUB CHANNELS` treat as glob syntax.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_is_reversible_and_keeps_the_tag_whole() {
        for name in [
            "plain",
            "{tag}",
            "}{",
            "%7B",
            "100%",
            "a%25b",
            "ключ 🔒",
            "*?[]\\",
            "x}:lock",
        ] {
            let enc = encode(name);
            assert!(!enc.contains('{') && !enc.contains('}'), "{enc}");
            assert_eq!(decode(&enc).as_deref(), Some(name));
            let ks = KeySpace::new("distlock");
            let n = LockName::new(name).unwrap();
            let key = ks.lock_key(&n);
            // The hash tag is everything between the first '{' and the next '}'.
            let open = key.find('{').unwrap();
            let close = key[open..].find('}').unwrap() + open;
            assert_eq!(&key[open + 1..close], enc);
            assert_eq!(ks.parse(&key), Some((name.to_string(), "lock")));
            assert_eq!(
                ks.parse(&ks.fence_key(&n)),
                Some((name.to_string(), "fence"))
            );
            assert_eq!(
                ks.parse(&ks.holders_key(&n)),
                Some((name.to_string(), "permits"))
            );
            assert_eq!(
                ks.parse(&ks.semaphore_key(&n)),
                Some((name.to_string(), "semaphore"))
            );
        }
        assert_eq!(decode("%7"), None);
        assert_eq!(decode("%41"), None);
    }

    #[test]
    fn distinct_names_get_distinct_keys() {
        let ks = KeySpace::new("p");
        let key = |s: &str| ks.lock_key(&LockName::new(s).unwrap());
        assert_ne!(key("{a}"), key("%7Ba%7D"));
        assert_ne!(key("Lock"), key("lock"));
        assert_ne!(key("\u{e9}"), key("e\u{301}"));
    }

    #[test]
    fn patterns_escape_glob_syntax() {
        let ks = KeySpace::new("a*b");
        assert_eq!(ks.pattern("x?[{"), "a\\*b:{x\\?\\[%7B*");
    }

    #[test]
    fn prefixes_that_would_break_the_tag_are_rejected() {
        assert!(check_prefix("distlock").is_ok());
        assert!(check_prefix("app:locks").is_ok());
        for bad in ["", "a{b", "a}b", "has space", "tab\t", &"p".repeat(65)] {
            assert!(check_prefix(bad).is_err(), "{bad:?}");
        }
    }
}
