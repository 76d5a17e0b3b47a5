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
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(Arc<str>);

impl LockName {
    /// Validates `name`; a bad name is an [`ErrorKind::InvalidArgument`] that says what is wrong.
    pub fn new(name: impl AsRef<str>) -> Result<Self, Error> {
        let name = name.as_ref();
        // The common case, checked in one branch-free pass over the bytes: printable ASCII,
        // not all spaces.
        if (1..=MAX_NAME_LEN).contains(&name.len()) {
            let (mut printable, mut blank) = (true, true);
            for &b in name.as_bytes() {
                printable &= b.wrapping_sub(b' ') <= b'~' - b' ';
                blank &= b == b' ';
            }
            if printable && !blank {
                return Ok(Self(name.into()));
            }
        }
        let problem = if name.is_empty() {
            Some("is empty".to_string())
        } else if name.len() > MAX_NAME_LEN {
            Some(format!(
                "is {} bytes long; the limit is {MAX_NAME_LEN}",
                name.len()
            ))
        } else if let Some(c) = name.chars().find(|c| c.is_control()) {
            Some(format!("contains the control character U+{:04X}", c as u32))
        } else if name.chars().all(char::is_whitespace) {
            Some("is only whitespace".to_string())
        } else {
            None
        };
        match problem {
            Some(p) => Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("lock name {:?} {p}", truncate(name)),
            )),
            None => Ok(Self(name.into())),
        }
    }

    /// The name as the user gave it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
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
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
}
