//! Lock names and owner ids, validated once for every backend.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, ErrorKind};

/// The longest lock name, in bytes of UTF-8.
pub const MAX_NAME_LEN: usize = 255;
/// The longest owner id, in bytes.
pub const MAX_OWNER_LEN: usize = 64;

/// A validated lock name: 1..=255 bytes of UTF-8, no control characters (NUL included), not only
/// whitespace. Names are case-sensitive on every backend; characters a backend cannot store raw
/// are encoded by that backend, reversibly, and never shown to the user.
#[derive(Clone, PartialOrd, Ord)]
pub struct LockName(Arc<str>);

impl LockName {
    /// Validates `name`; a bad name is an [`ErrorKind::InvalidArgument`] that says what is wrong.
    pub fn new(name: impl AsRef<str>) -> Result<Self, Error> {
        let name = name.as_ref();
        check_name(name)?;
        Ok(Self::checked(name))
    }

    /// A name that [`check_name`] has accepted.
    pub(crate) fn checked(name: &str) -> Self {
        Self(name.into())
    }

    /// The name as the user gave it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Equality and hashing by text, as derived, except that two handles on one allocation are equal
/// without a look at the bytes. A grant's name and owner are clones of the ones the backend keeps,
/// so this is the common case of every conditional release and renew. (`Arc`'s own `==` compares
/// pointers first only for sized contents, not for `str`.)
macro_rules! text_identity {
    ($($t:ty),*) => {$(
        impl PartialEq for $t {
            fn eq(&self, other: &Self) -> bool {
                Arc::ptr_eq(&self.0, &other.0) || *self.0 == *other.0
            }
        }

        impl Eq for $t {}

        impl std::hash::Hash for $t {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                (*self.0).hash(state);
            }
        }
    )*};
}

text_identity!(LockName, OwnerId);

/// Checks a lock name without allocating: what [`LockName::new`] checks.
pub(crate) fn check_name(name: &str) -> Result<(), Error> {
    if (1..=MAX_NAME_LEN).contains(&name.len()) && printable_ascii(name.as_bytes()) {
        return Ok(());
    }
    match name_problem(name) {
        Some(problem) => Err(problem),
        None => Ok(()),
    }
}

/// What is wrong with a name the fast check refused (`None`: nothing; it is valid but not
/// printable ASCII). Kept out of line so the fast check stays small.
#[cold]
#[inline(never)]
fn name_problem(name: &str) -> Option<Error> {
    let problem = if name.is_empty() {
        "is empty".to_string()
    } else if name.len() > MAX_NAME_LEN {
        format!("is {} bytes long; the limit is {MAX_NAME_LEN}", name.len())
    } else if let Some(c) = name.chars().find(|c| c.is_control()) {
        format!("contains the control character U+{:04X}", c as u32)
    } else if name.chars().all(char::is_whitespace) {
        "is only whitespace".to_string()
    } else {
        return None;
    };
    Some(Error::new(
        ErrorKind::InvalidArgument,
        format!("lock name {:?} {problem}", truncate(name)),
    ))
}

/// The common case, in one pass eight bytes at a time: only printable ASCII (`' '..='~'`), and
/// not only spaces.
fn printable_ascii(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    const SPACES: u64 = u64::from_ne_bytes([b' '; 8]);
    // With each byte's high bit masked off (x <= 0x7f), adding 0x60 sets a byte's high bit iff
    // x >= ' ', and adding 1 iff x == 0x7f; neither sum passes 0xff, so no carry crosses into
    // the next byte. A byte with its own high bit set is not ASCII at all.
    let bad = |w: u64| {
        let x = w & !HIGH;
        (!x.wrapping_add(ONES * 0x60) | x.wrapping_add(ONES) | w) & HIGH
    };
    let (mut out, mut blank) = (0u64, true);
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        // The byte order does not matter: every byte is judged alone.
        let Ok(word) = <[u8; 8]>::try_from(word) else {
            return false; // `chunks_exact(8)` yields eight bytes
        };
        let w = u64::from_ne_bytes(word);
        out |= bad(w);
        blank &= w == SPACES;
    }
    for &b in words.remainder() {
        out |= u64::from(!(b' '..=b'~').contains(&b));
        blank &= b == b' ';
    }
    out == 0 && !blank
}

fn truncate(s: &str) -> String {
    if s.len() <= 64 {
        return s.to_string();
    }
    let mut end = 64;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

// `Hash` and `Eq` are the `str`'s, so maps keyed by names can be searched with a `&str`.
impl std::borrow::Borrow<str> for LockName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for LockName {
    type Error = Error;
    fn try_from(s: &str) -> Result<Self, Error> {
        Self::new(s)
    }
}

/// Who holds a lock. Reentrancy is per owner id: the same owner acquiring a name it holds adds
/// to its hold count (on reentrant backends).
///
/// 1..=64 bytes of ASCII letters, digits, `-`, `_`, `.` and `:`, so every backend can store it
/// raw (in a Redis hash field, a SQL column, an etcd key, a ZooKeeper node name).
#[derive(Clone, PartialOrd, Ord)]
pub struct OwnerId(Arc<str>);

impl OwnerId {
    /// Validates a caller-chosen owner id.
    pub fn new(id: impl AsRef<str>) -> Result<Self, Error> {
        let id = id.as_ref();
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':');
        if id.is_empty() || id.len() > MAX_OWNER_LEN || !id.chars().all(ok_char) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "owner id {:?} must be 1..={MAX_OWNER_LEN} characters of [A-Za-z0-9-_.:]",
                    truncate(id)
                ),
            ));
        }
        Ok(Self(id.into()))
    }

    /// A fresh random owner id (128 random bits, hex).
    pub fn random() -> Self {
        Self(uuid::Uuid::new_v4().simple().to_string().into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The eight-bytes-at-a-time check against the byte-by-byte definition, for every byte
    /// value at every position of a word and of the tail, next to every neighbour value (a
    /// borrow or carry crossing bytes would show up as a neighbour changing the answer).
    #[test]
    fn word_wise_check_agrees_with_the_bytewise_definition() {
        let ok = |b: u8| (b' '..=b'~').contains(&b);
        for len in [1, 7, 8, 9, 16, 17] {
            for pos in 0..len {
                for b in 0..=255u8 {
                    for n in [0u8, 0x1f, b' ', b'a', b'~', 0x7f, 0x80, 0xff] {
                        let mut v = vec![n; len];
                        v[pos] = b;
                        let want = v.iter().all(|&c| ok(c)) && v.iter().any(|&c| c != b' ');
                        assert_eq!(printable_ascii(&v), want, "{v:02x?}");
                    }
                }
            }
        }
    }

    #[test]
    fn names_at_the_limits() {
        assert!(LockName::new("a".repeat(255)).is_ok());
        assert_eq!(
            LockName::new("a".repeat(256)).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        // 85 three-byte characters = 255 bytes; one more is over.
        assert!(LockName::new("€".repeat(85)).is_ok());
        assert!(LockName::new("€".repeat(86)).is_err());
        for bad in ["", " ", "\t\n", "a\0b", "a\nb", "\u{7f}", "x\u{85}"] {
            assert!(LockName::new(bad).is_err(), "{bad:?} accepted");
        }
        for good in [
            "/",
            ".",
            "..",
            "a/../b",
            "zookeeper",
            "Ünïcødé 🔒",
            " padded ",
        ] {
            assert_eq!(LockName::new(good).unwrap().as_str(), good);
        }
    }

    #[test]
    fn owner_ids() {
        assert_eq!(OwnerId::random().as_str().len(), 32);
        assert_ne!(OwnerId::random(), OwnerId::random());
        assert!(OwnerId::new("worker-1:pid.42_a").is_ok());
        for bad in ["", "a b", "a/b", &"x".repeat(65), "é"] {
            assert!(OwnerId::new(bad).is_err(), "{bad:?} accepted");
        }
    }

    /// Equality by text whether or not two handles share an allocation, and hashing that agrees
    /// with `str`'s, so a map keyed by names is still found by `&str`.
    #[test]
    fn names_and_owners_compare_by_text() {
        use std::collections::HashMap;
        use std::hash::BuildHasher;

        let a = LockName::new("jobs/nightly").unwrap();
        let b = LockName::new(String::from("jobs/") + "nightly").unwrap();
        assert!(!Arc::ptr_eq(&a.0, &b.0));
        assert_eq!(a, b);
        assert_eq!(a, a.clone());
        assert_ne!(a, LockName::new("jobs/nightlY").unwrap());
        assert_ne!(a, LockName::new("jobs/nightl").unwrap());
        let hasher = std::collections::hash_map::RandomState::new();
        assert_eq!(hasher.hash_one(&a), hasher.hash_one(&b));
        assert_eq!(hasher.hash_one(&a), hasher.hash_one("jobs/nightly"));
        let map = HashMap::from([(a.clone(), 7)]);
        assert_eq!(map.get("jobs/nightly"), Some(&7));
        assert_eq!(map.get(&b), Some(&7));

        let o = OwnerId::new("worker-1").unwrap();
        let p = OwnerId::new(String::from("worker-") + "1").unwrap();
        assert!(!Arc::ptr_eq(&o.0, &p.0));
        assert_eq!(o, p);
        assert_ne!(o, OwnerId::new("worker-2").unwrap());
        assert_eq!(hasher.hash_one(&o), hasher.hash_one(&p));
    }
}
