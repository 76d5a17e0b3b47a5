//! Where lock keys live: `<prefix>/<encoded name>/<lease id>-<owner>`.
//!
//! The name segment percent-encodes `%` and `/` and nothing else, so it never contains `/`:
//! the directory `<prefix>/<encoded name>/` of one name is then never a prefix of another's,
//! and `.`, `..` and any Unicode are stored as they are (etcd keys are opaque bytes, there is
//! no path resolution to fool). The last segment is the client's lease id (16 hex digits) and
//! the owner id: the lease alone would let two owners on one client collide on one key, and
//! the owner alone would let two clients with the same owner id collide.

use distlock_api::backend::{escape, unescape};
use distlock_api::OwnerId;

/// `name` with `%` and `/` percent-encoded: reversible, and free of `/`.
pub(crate) fn encode_name(name: &str) -> String {
    escape(name, &['/'])
}

/// The inverse of [`encode_name`]; `None` for a segment it cannot have produced.
pub(crate) fn decode_name(segment: &str) -> Option<String> {
    unescape(segment, &['/'])
}

/// The directory holding `name`'s holder and waiters, ending in `/`.
pub(crate) fn lock_dir(prefix: &str, name: &str) -> String {
    format!("{prefix}/{}/", encode_name(name))
}

/// The key of `owner`'s entry for the lock whose directory is `dir`, under lease `lease`.
pub(crate) fn entry_key(dir: &str, lease: i64, owner: &OwnerId) -> String {
    format!("{dir}{lease:016x}-{owner}")
}

/// The lease and owner of the entry `key` under `dir`; `None` if it is not an entry key.
pub(crate) fn parse_entry(dir: &str, key: &[u8]) -> Option<(i64, OwnerId)> {
    let rest = std::str::from_utf8(key).ok()?.strip_prefix(dir)?;
    let (lease, owner) = rest.split_at_checked(16)?;
    let owner = owner.strip_prefix('-')?;
    let lease = i64::from_str_radix(lease, 16).ok()?;
    Some((lease, OwnerId::parse(owner).ok()?))
}

/// The lease id an entry key was written under, from its last segment.
pub(crate) fn lease_of(key: &str) -> Option<i64> {
    let last = key.rsplit('/').next()?;
    i64::from_str_radix(last.get(..16)?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_is_reversible_and_slash_free() {
        for name in [
            "/", ".", "..", "a/b", "a/../b", "a//b", "%2F", "%", "100%/x", "ключ", "🔒", "e\u{301}",
        ] {
            let enc = encode_name(name);
            assert!(!enc.contains('/'), "{name:?} -> {enc:?}");
            assert_eq!(decode_name(&enc).as_deref(), Some(name));
        }
        assert_eq!(encode_name("a/b%"), "a%2Fb%25");
        assert_eq!(decode_name("a%2"), None);
        assert_eq!(decode_name("a/b"), None);
    }

    #[test]
    fn no_directory_is_a_prefix_of_another_names_keys() {
        let names = [
            "a", "a/", "a/b", "/a", "a%2F", "a%", "ab", ".", "..", "%2F", "/",
        ];
        for x in names {
            for y in names {
                let (dx, dy) = (lock_dir("/p", x), lock_dir("/p", y));
                if x != y {
                    assert!(
                        !dy.starts_with(&dx),
                        "{x:?} dir {dx:?} prefixes {y:?} dir {dy:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn entry_keys_round_trip() {
        let owner = OwnerId::new("worker-1:a.b_c").unwrap();
        let dir = lock_dir("/distlock", "jobs/42");
        let key = entry_key(&dir, 0x694d_8a3b_1c2e_f001, &owner);
        assert_eq!(key, "/distlock/jobs%2F42/694d8a3b1c2ef001-worker-1:a.b_c");
        assert_eq!(
            parse_entry(&dir, key.as_bytes()),
            Some((0x694d_8a3b_1c2e_f001, owner))
        );
        assert_eq!(lease_of(&key), Some(0x694d_8a3b_1c2e_f001));
        assert_eq!(parse_entry(&dir, b"/distlock/jobs%2F42/zz"), None);
        assert_eq!(parse_entry("/other/", key.as_bytes()), None);
    }
}
