//! Where lock keys live: `<prefix>/<encoded name>/<lease id>-<owner>` for a lock's entries,
//! `<prefix>/<encoded name>/~<max>~<lease id>-<owner>` for a semaphore's permits.
//!
//! The name segment percent-encodes `%` and `/` and nothing else, so it never contains `/`:
//! the directory `<prefix>/<encoded name>/` of one name is then never a prefix of another's,
//! and `.`, `..` and any Unicode are stored as they are (etcd keys are opaque bytes, there is
//! no path resolution to fool). The last segment is the client's lease id (16 hex digits) and
//! the owner id: the lease alone would let two owners on one client collide on one key, and
//! the owner alone would let two clients with the same owner id collide.
//!
//! An election's leader value lives beside the directory, at `<prefix>/<encoded name>` (the
//! directory's path without its `/`): outside every directory, so no queue read, watch or
//! count meets it, and one slot per name that each proclaim overwrites. It holds
//! `<epoch>:<value>`, the epoch being the proclaiming grant's token.
//!
//! A permit's entry carries the semaphore's size in its key, after a `~`, which sorts after
//! every hex digit a lock's entry starts with. A name's lock entries, its permit entries of one
//! size and those of every other size are then separate ranges of its directory, and one
//! transaction can ask that the ranges a request must not meet are empty (a range compare of
//! `create_revision == 0`, which holds for an empty range) while it creates its own entry.

use distlock_api::backend::{escape, unescape};
use distlock_api::{Error, ErrorKind, OwnerId};

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

/// The key of the leader value of election `name`: the directory's path without its `/`.
pub(crate) fn value_key(prefix: &str, name: &str) -> String {
    format!("{prefix}/{}", encode_name(name))
}

/// What the value key holds: the epoch (the grant's token) and the value.
pub(crate) fn encode_value(epoch: i64, value: &str) -> String {
    format!("{epoch}:{value}")
}

/// The epoch and value of what the value key holds; `None` if it is not what
/// [`encode_value`] writes.
pub(crate) fn decode_value(stored: &[u8]) -> Option<(i64, &str)> {
    let (epoch, value) = std::str::from_utf8(stored).ok()?.split_once(':')?;
    Some((epoch.parse().ok()?, value))
}

/// The key of `owner`'s entry for the lock whose directory is `dir`, under lease `lease`.
pub(crate) fn entry_key(dir: &str, lease: i64, owner: &OwnerId) -> String {
    format!("{dir}{lease:016x}-{owner}")
}

/// What starts a permit's entry: after every hex digit, so a name's permit entries sort after
/// its lock entries.
const PERMIT_MARK: char = '~';

/// The key of `owner`'s permit of a semaphore of `max` permits whose directory is `dir`, under
/// lease `lease`.
pub(crate) fn permit_key(dir: &str, max: u32, lease: i64, owner: &OwnerId) -> String {
    format!("{dir}{PERMIT_MARK}{max}{PERMIT_MARK}{lease:016x}-{owner}")
}

/// The key of `owner`'s entry for `permits` (1: the lock, else a permit of a semaphore of that
/// many).
pub(crate) fn key_for(dir: &str, permits: u32, lease: i64, owner: &OwnerId) -> String {
    match permits {
        1 => entry_key(dir, lease, owner),
        max => permit_key(dir, max, lease, owner),
    }
}

/// What an entry key says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The permits of the name it was made for: 1 for a lock's entry, the semaphore's size
    /// for a permit's.
    pub(crate) max: u32,
    pub(crate) lease: i64,
    pub(crate) owner: OwnerId,
}

/// What the entry `key` under `dir` says; `None` if it is not an entry key.
pub(crate) fn parse_entry(dir: &str, key: &[u8]) -> Option<Entry> {
    let rest = std::str::from_utf8(key).ok()?.strip_prefix(dir)?;
    let (max, rest) = split_size(rest)?;
    let (lease, owner) = rest.split_at_checked(16)?;
    let owner = owner.strip_prefix('-')?;
    let lease = i64::from_str_radix(lease, 16).ok()?;
    Some(Entry {
        max,
        lease,
        owner: OwnerId::parse(owner).ok()?,
    })
}

/// The semaphore size a last key segment starts with (1 if none: a lock's entry), and the rest.
fn split_size(segment: &str) -> Option<(u32, &str)> {
    let Some(rest) = segment.strip_prefix(PERMIT_MARK) else {
        return Some((1, segment));
    };
    let (max, rest) = rest.split_once(PERMIT_MARK)?;
    // Only the digits `permit_key` writes: no sign, no leading zero.
    if max.starts_with('0') || !max.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((max.parse().ok().filter(|&m| m > 1)?, rest))
}

/// The lease id an entry key was written under, from its last segment.
pub(crate) fn lease_of(key: &str) -> Option<i64> {
    let (_, last) = split_size(key.rsplit('/').next()?)?;
    i64::from_str_radix(last.get(..16)?, 16).ok()
}

/// The first key after every key under `dir` (the end of its range): `dir` ends in `/`, and
/// `0` is the byte after it.
pub(crate) fn dir_end(dir: &str) -> String {
    let base = dir.strip_suffix('/').unwrap_or(dir);
    format!("{base}0")
}

/// The range of `dir`'s permit entries, of every size: `[start, end)`.
pub(crate) fn permits_range(dir: &str) -> (String, String) {
    (format!("{dir}{PERMIT_MARK}"), dir_end(dir))
}

/// The ranges of `dir`'s entries that are not permits of a semaphore of `max`: the lock's
/// entries and the permits of every other size, below and above those of `max`.
pub(crate) fn other_than_size(dir: &str, max: u32) -> [(String, String); 2] {
    let below = format!("{dir}{PERMIT_MARK}{max}{PERMIT_MARK}");
    // `~` + 1: the end of the range of keys that start with `below`.
    let above = format!("{dir}{PERMIT_MARK}{max}\u{7f}");
    [(dir.to_string(), below), (above, dir_end(dir))]
}

/// The error of an entry key that could not be created in three tries.
pub(crate) fn keeps_reappearing(key: &str) -> Error {
    Error::new(
        ErrorKind::Backend,
        format!("could not create the lock key {key:?}: it keeps reappearing"),
    )
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
        let entry = |max| Entry {
            max,
            lease: 0x694d_8a3b_1c2e_f001,
            owner: owner.clone(),
        };
        assert_eq!(parse_entry(&dir, key.as_bytes()), Some(entry(1)));
        assert_eq!(lease_of(&key), Some(0x694d_8a3b_1c2e_f001));
        assert_eq!(parse_entry(&dir, b"/distlock/jobs%2F42/zz"), None);
        assert_eq!(parse_entry("/other/", key.as_bytes()), None);

        let permit = permit_key(&dir, 12, 0x694d_8a3b_1c2e_f001, &owner);
        assert_eq!(
            permit,
            "/distlock/jobs%2F42/~12~694d8a3b1c2ef001-worker-1:a.b_c"
        );
        assert_eq!(permit, key_for(&dir, 12, 0x694d_8a3b_1c2e_f001, &owner));
        assert_eq!(key, key_for(&dir, 1, 0x694d_8a3b_1c2e_f001, &owner));
        assert_eq!(parse_entry(&dir, permit.as_bytes()), Some(entry(12)));
        assert_eq!(lease_of(&permit), Some(0x694d_8a3b_1c2e_f001));
        for bad in ["~~", "~1~", "~01~", "~+2~", "~x~", "~2"] {
            let k = format!("{dir}{bad}694d8a3b1c2ef001-worker-1");
            assert_eq!(parse_entry(&dir, k.as_bytes()), None, "{k}");
        }
    }

    #[test]
    fn value_keys_are_outside_every_directory() {
        let names = ["a", "a/", "a/b", "ab", "%", "/"];
        for x in names {
            let value = value_key("/p", x);
            assert_eq!(format!("{value}/"), lock_dir("/p", x));
            for y in names {
                let dir = lock_dir("/p", y);
                assert!(!value.starts_with(&dir), "{x:?} value {value:?} in {dir:?}");
            }
        }
        for v in ["", "x", "a:b:c", "ключ\n🔒"] {
            let stored = encode_value(42, v);
            assert_eq!(decode_value(stored.as_bytes()), Some((42, v)));
        }
        assert_eq!(decode_value(b"7"), None);
        assert_eq!(decode_value(b"x:7"), None);
    }

    #[test]
    fn the_ranges_part_a_directory_by_kind_and_size() {
        let owner = OwnerId::new("o").unwrap();
        let dir = lock_dir("/p", "n");
        let inside =
            |k: &str, (start, end): &(String, String)| k >= start.as_str() && k < end.as_str();
        let lock = entry_key(&dir, i64::MIN, &owner);
        let lock_hi = entry_key(&dir, -1, &owner);
        let lock_lo = entry_key(&dir, 0, &owner);
        let p3 = permit_key(&dir, 3, -1, &owner);
        let p30 = permit_key(&dir, 30, 0, &owner);
        let p2 = permit_key(&dir, 2, 0, &owner);
        let p4 = permit_key(&dir, 4, 0, &owner);
        let whole = (dir.clone(), dir_end(&dir));
        for k in [&lock, &lock_hi, &lock_lo, &p3, &p30, &p2, &p4] {
            assert!(inside(k, &whole), "{k}");
        }
        let permits = permits_range(&dir);
        for k in [&lock, &lock_hi, &lock_lo] {
            assert!(!inside(k, &permits), "{k}");
        }
        for k in [&p3, &p30, &p2, &p4] {
            assert!(inside(k, &permits), "{k}");
        }
        let others = other_than_size(&dir, 3);
        for k in [&lock, &lock_hi, &lock_lo, &p30, &p2, &p4] {
            assert!(others.iter().any(|r| inside(k, r)), "{k}");
        }
        assert!(!others.iter().any(|r| inside(&p3, r)));
        // Nothing of another name falls in them.
        let other = permit_key(&lock_dir("/p", "n0"), 3, 0, &owner);
        assert!(!inside(&other, &whole));
    }
}
