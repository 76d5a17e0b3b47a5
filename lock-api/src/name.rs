//! Lock names and owner ids, validated once for every backend.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use crate::error::{Error, ErrorKind};

/// The longest lock name, in bytes of UTF-8.
pub const MAX_NAME_LEN: usize = 255;
/// The longest owner id label (what a caller may choose), in bytes.
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

text_identity!(LockName);

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

/// Rejects a name prefix (for listing) that no name could start with: longer than a name may
/// be, or with a control character. The empty prefix, every name, is fine.
pub(crate) fn check_prefix(prefix: &str) -> Result<(), Error> {
    let problem = if prefix.len() > MAX_NAME_LEN {
        format!(
            "is {} bytes long; the limit is {MAX_NAME_LEN}",
            prefix.len()
        )
    } else if let Some(c) = prefix.chars().find(|c| c.is_control()) {
        format!("contains the control character U+{:04X}", c as u32)
    } else {
        return Ok(());
    };
    Err(Error::new(
        ErrorKind::InvalidArgument,
        format!("lock name prefix {:?} {problem}", truncate(prefix)),
    ))
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

/// Who holds a lock: the identity a server stores with a hold, and the unit of reentrancy.
///
/// An owner id has a *label* — 1..=64 bytes of ASCII letters, digits, `-`, `_`, `.` and `:` —
/// and, for the ids distlock makes, a *tag* that tells acquisitions apart:
///
/// - every acquisition without an explicit owner gets its own id, the client's label plus
///   `#` and a per-acquisition number (`3f9a…c2#1a`): two tasks sharing one client handle, or
///   one task asking twice, are two owners and exclude each other;
/// - an explicit owner ([`LockOptions::owner`](crate::LockOptions::owner)) is qualified by the
///   client handle that uses it, `@` and the handle's tag (`job-7@5e01c2d4`): it re-enters on
///   that handle only, and another handle with the same label is answered like anyone else.
///
/// The whole text ([`text`](OwnerId::text), [`Display`](fmt::Display)) is what the server
/// stores: at most [`MAX_OWNER_TEXT_LEN`] bytes of the characters above plus `#` and `@`, so
/// every backend stores it raw (a Redis hash field, a SQL column, an etcd key, a ZooKeeper node's
/// data). The tag is a number beside the shared label, so making an acquisition's id costs no
/// allocation.
#[derive(Clone)]
pub struct OwnerId {
    /// One pointer wide (an `Arc<str>` is two), so the id is two words: it rides in every
    /// grant and guard, which the in-memory lock cycle moves several times.
    label: Arc<String>,
    /// 0: none; otherwise `kind | value`, `value` below [`TAG_KIND`].
    tag: u64,
}

/// The tag bit that marks a handle tag (`@`); without it a tag is an acquisition's (`#`).
const TAG_KIND: u64 = 1 << 63;

/// The longest text an owner id can have: a label, a separator and a 63-bit hex tag.
pub const MAX_OWNER_TEXT_LEN: usize = MAX_OWNER_LEN + 1 + 16;

fn label_problem(id: &str) -> Option<Error> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':');
    if id.is_empty() || id.len() > MAX_OWNER_LEN || !id.chars().all(ok_char) {
        return Some(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "owner id {:?} must be 1..={MAX_OWNER_LEN} characters of [A-Za-z0-9-_.:]",
                truncate(id)
            ),
        ));
    }
    None
}

impl OwnerId {
    /// Validates a caller-chosen owner id (a label: no tag).
    pub fn new(id: impl AsRef<str>) -> Result<Self, Error> {
        let id = id.as_ref();
        match label_problem(id) {
            Some(e) => Err(e),
            None => Ok(Self {
                label: Arc::new(id.to_owned()),
                tag: 0,
            }),
        }
    }

    /// Reads back an owner id as a server stored it ([`text`](OwnerId::text)): a label, or a
    /// label with its `#` or `@` tag.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let bad = || {
            Error::new(
                ErrorKind::Backend,
                format!("stored owner id {:?} is malformed", truncate(text)),
            )
        };
        let Some(at) = text.rfind(['#', '@']) else {
            return Self::new(text);
        };
        let (label, rest) = text.split_at(at);
        let digits = &rest[1..];
        if digits.is_empty() || digits.len() > 16 || !digits.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(bad());
        }
        let value = u64::from_str_radix(digits, 16).map_err(|_| bad())?;
        if value == 0 || value >= TAG_KIND {
            return Err(bad());
        }
        let kind = if rest.starts_with('@') { TAG_KIND } else { 0 };
        let mut id = Self::new(label).map_err(|_| bad())?;
        id.tag = kind | value;
        Ok(id)
    }

    /// A fresh random owner id (128 random bits, hex).
    pub fn random() -> Self {
        Self {
            label: Arc::new(uuid::Uuid::new_v4().simple().to_string()),
            tag: 0,
        }
    }

    /// A readable id for a client of this process: `host:pid:xxxxxxxx` (the host name cut to
    /// 32 characters of the allowed ones, the process id, 32 random bits in hex), so an
    /// operator reading `holder(name)` sees which machine and process holds a lock.
    pub fn for_this_process() -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .or_else(|_| std::fs::read_to_string("/etc/hostname"))
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .or_else(|| std::env::var("COMPUTERNAME").ok())
            .unwrap_or_default();
        Self::for_host(&host, std::process::id(), fastrand::u32(..))
    }

    fn for_host(host: &str, pid: u32, unique: u32) -> Self {
        let ok = |c: &char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        let mut host: String = host.trim().chars().filter(ok).take(32).collect();
        if host.is_empty() {
            host.push_str("host");
        }
        Self {
            label: Arc::new(format!("{host}:{pid}:{unique:08x}")),
            tag: 0,
        }
    }

    /// The id of one acquisition: this id's label tagged with `n` (`label#n`), sharing the
    /// label's allocation. `n` must be at least 1 and below 2^63.
    pub(crate) fn acquisition(&self, n: u64) -> Self {
        debug_assert!(n != 0 && n < TAG_KIND);
        Self {
            label: self.label.clone(),
            tag: n & !TAG_KIND,
        }
    }

    /// This id's label qualified by a client handle's tag (`label@tag`).
    pub(crate) fn on_handle(&self, handle: u64) -> Self {
        debug_assert!(handle != 0 && handle < TAG_KIND);
        Self {
            label: self.label.clone(),
            tag: TAG_KIND | handle,
        }
    }

    /// The label: the caller's chosen id, or the client's.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Whether this id carries a tag (an acquisition's or a handle's).
    pub fn is_tagged(&self) -> bool {
        self.tag != 0
    }

    /// Whether this is a label qualified by the handle tagged `handle`.
    pub(crate) fn is_handle_tag(&self, handle: u64) -> bool {
        self.tag == TAG_KIND | handle
    }

    /// Whether this is one acquisition's id.
    pub(crate) fn is_acquisition_tag(&self) -> bool {
        self.tag != 0 && self.tag & TAG_KIND == 0
    }

    /// Whether both ids share one label allocation (so one can stand in for the other's label).
    pub(crate) fn shares_label(&self, other: &OwnerId) -> bool {
        Arc::ptr_eq(&self.label, &other.label)
    }

    /// This id with `other`'s tag (the caller checked the labels are equal).
    pub(crate) fn with_tag_of(mut self, other: &OwnerId) -> OwnerId {
        self.tag = other.tag;
        self
    }

    /// The whole id as text, as the server stores it; borrowed when there is no tag.
    pub fn text(&self) -> Cow<'_, str> {
        if self.tag == 0 {
            Cow::Borrowed(self.label.as_str())
        } else {
            Cow::Owned(self.to_string())
        }
    }
}

impl PartialEq for OwnerId {
    fn eq(&self, other: &Self) -> bool {
        // Texts are equal exactly when labels and tags are: labels hold neither `#` nor `@`.
        self.tag == other.tag
            && (Arc::ptr_eq(&self.label, &other.label) || *self.label == *other.label)
    }
}

impl Eq for OwnerId {}

impl std::hash::Hash for OwnerId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.label.as_str().hash(state);
        self.tag.hash(state);
    }
}

impl PartialOrd for OwnerId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OwnerId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.label.as_str(), self.tag).cmp(&(other.label.as_str(), other.tag))
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label)?;
        match self.tag {
            0 => Ok(()),
            t if t & TAG_KIND != 0 => write!(f, "@{:x}", t & !TAG_KIND),
            t => write!(f, "#{t:x}"),
        }
    }
}

impl fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.to_string(), f)
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
        assert_eq!(OwnerId::random().text().len(), 32);
        let me = OwnerId::for_this_process();
        assert!(OwnerId::new(me.label()).is_ok(), "{me}");
        assert!(
            me.label().contains(&format!(":{}:", std::process::id())),
            "{me}"
        );
        assert_eq!(
            OwnerId::for_host(" web-1.example.org\n", 42, 0xbeef).text(),
            "web-1.example.org:42:0000beef"
        );
        assert_eq!(OwnerId::for_host("", 7, 1).text(), "host:7:00000001");
        let long = OwnerId::for_host(&"h".repeat(300), u32::MAX, u32::MAX);
        assert!(long.text().len() <= MAX_OWNER_LEN, "{long}");
        assert_ne!(OwnerId::random(), OwnerId::random());
        assert!(OwnerId::new("worker-1:pid.42_a").is_ok());
        for bad in ["", "a b", "a/b", &"x".repeat(65), "é"] {
            assert!(OwnerId::new(bad).is_err(), "{bad:?} accepted");
        }
    }

    /// An owner id is two words, as it was before it had a tag: it is moved with every grant.
    #[test]
    fn an_owner_id_is_two_words() {
        assert_eq!(
            std::mem::size_of::<OwnerId>(),
            2 * std::mem::size_of::<usize>()
        );
    }

    /// Tagged ids read back from their text as they were, and compare equal exactly when their
    /// texts are.
    #[test]
    fn owner_ids_round_trip_through_their_text() {
        let base = OwnerId::new("worker-1").unwrap();
        let acq = base.acquisition(0x1a);
        let on = base.on_handle(0x5e01_c2d4);
        assert_eq!(acq.to_string(), "worker-1#1a");
        assert_eq!(on.to_string(), "worker-1@5e01c2d4");
        assert_eq!(base.text(), "worker-1");
        for id in [&base, &acq, &on] {
            let back = OwnerId::parse(&id.text()).unwrap();
            assert_eq!(&back, id);
            assert_eq!(back.label(), "worker-1");
        }
        assert_ne!(acq, base);
        assert_ne!(acq, on);
        assert_ne!(base.acquisition(1), base.acquisition(2));
        let longest = OwnerId::new("x".repeat(MAX_OWNER_LEN))
            .unwrap()
            .acquisition(TAG_KIND - 1);
        assert_eq!(longest.text().len(), MAX_OWNER_TEXT_LEN);
        for bad in [
            "a#",
            "a#0",
            "a#xyz",
            "#1",
            "a@",
            "a b#1",
            "a#10000000000000000",
        ] {
            assert!(OwnerId::parse(bad).is_err(), "{bad:?} parsed");
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
        assert!(!Arc::ptr_eq(&o.label, &p.label));
        assert_eq!(o, p);
        assert_ne!(o, OwnerId::new("worker-2").unwrap());
        assert_eq!(hasher.hash_one(&o), hasher.hash_one(&p));
    }
}
