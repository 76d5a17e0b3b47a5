//! ZooKeeper paths: the checks on configured ones, lock names as path segments, and the queue
//! nodes below them.
//!
//! A lock `name` lives at `<base>/<segment>` where `segment` is [`encode_name`]`(name)`; each
//! contender adds an ephemeral-sequential child `_c_<uuid>-lock-<sequence>` to it, and each
//! contender for a permit of a semaphore of `max` a child `_c_<uuid>-sem<max>-lock-<sequence>`.

use std::fmt::Write as _;

use distlock_api::Result;

use crate::error::invalid;

/// Every encoded name starts with this character, so no segment is ever `.`, `..` or
/// `zookeeper` raw and the encoding stays reversible.
const NAME_MARK: char = '_';

/// What every queue node's name holds between the unique prefix and the sequence number. A
/// permit's node has it too, so that every client (one without semaphores included) counts
/// permits in the name's one queue.
const QUEUE_INFIX: &str = "-lock-";

/// What marks a permit's node, right before [`QUEUE_INFIX`]: `-sem<max>`.
const PERMIT_MARK: &str = "-sem";

/// Whether ZooKeeper rejects `c` in a path (or it needs escaping for the encoding to stay
/// reversible). The server checks Java `char`s, UTF-16 code units: it refuses controls,
/// U+D800..=U+F8FF (surrogates, hence every character outside the BMP, and the private use
/// area) and U+FFF0..=U+FFFF.
pub(crate) fn unstorable(c: char) -> bool {
    let u = c as u32;
    u <= 0x1f || (0x7f..=0x9f).contains(&u) || (0xd800..=0xf8ff).contains(&u) || u >= 0xfff0
}

/// Checks an absolute ZooKeeper path the way the server would, so a bad one is
/// `InvalidArgument` here rather than a server error later.
pub(crate) fn validate_path(what: &str, path: &str) -> Result<()> {
    if !path.starts_with('/') {
        return Err(invalid(format!("{what} {path:?} must start with '/'")));
    }
    if path == "/" {
        return Ok(());
    }
    if path.ends_with('/') {
        return Err(invalid(format!("{what} {path:?} must not end with '/'")));
    }
    for segment in path[1..].split('/') {
        if segment.is_empty() {
            return Err(invalid(format!("{what} {path:?} has an empty segment")));
        }
        if segment == "." || segment == ".." {
            return Err(invalid(format!("{what} {path:?} has a relative segment")));
        }
        if let Some(c) = segment.chars().find(|&c| unstorable(c)) {
            return Err(invalid(format!(
                "{what} {path:?} has U+{:04X}, which ZooKeeper does not accept in paths",
                c as u32
            )));
        }
    }
    if path == "/zookeeper" || path.starts_with("/zookeeper/") {
        return Err(invalid(format!(
            "{what} {path:?} is inside ZooKeeper's reserved /zookeeper tree"
        )));
    }
    Ok(())
}

/// The path segment of lock `name`: the mark, then the name with `/`, `%` and every character
/// ZooKeeper cannot store percent-encoded as UTF-8 bytes.
pub(crate) fn encode_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    out.push(NAME_MARK);
    for c in name.chars() {
        if c == '/' || c == '%' || unstorable(c) {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                // Writing to a String cannot fail.
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The lock name a segment made by [`encode_name`] stands for; `None` for any other node.
pub(crate) fn decode_name(segment: &str) -> Option<String> {
    distlock_api::config::percent_decode(segment.strip_prefix(NAME_MARK)?)
}

/// `parent/child`, without doubling the root's slash.
pub(crate) fn join(parent: &str, child: &str) -> String {
    if parent == "/" {
        format!("/{child}")
    } else {
        format!("{parent}/{child}")
    }
}

/// A fresh queue-node prefix, unique to one acquire attempt: after a connection loss during
/// its create, the contender finds its node by this prefix instead of leaving an orphan. A
/// request for a permit of a semaphore of `permits` (more than 1) carries that number in it.
pub(crate) fn new_queue_prefix(permits: u32) -> String {
    let id = uuid::Uuid::new_v4().simple();
    match permits {
        0 | 1 => format!("_c_{id}{QUEUE_INFIX}"),
        max => format!("_c_{id}{PERMIT_MARK}{max}{QUEUE_INFIX}"),
    }
}

/// One contender's node in a lock's queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct QueueNode {
    /// The node's name (not the full path).
    pub(crate) name: String,
    /// Its sequence number: the queue order.
    pub(crate) seq: i64,
    /// The permits its request asked for: 1 for a lock, the semaphore's `max` for a permit.
    pub(crate) max: u32,
}

/// The queue nodes among `children`, lowest sequence (the holder) first. Anything else a
/// lock node might hold (an operator's node) is ignored.
pub(crate) fn queue(children: Vec<String>) -> Vec<QueueNode> {
    let mut nodes: Vec<QueueNode> = children
        .into_iter()
        .filter_map(|name| {
            let (prefix, digits) = name.rsplit_once(QUEUE_INFIX)?;
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let seq = digits.parse().ok()?;
            let max = prefix
                .rsplit_once(PERMIT_MARK)
                .and_then(|(_, max)| max.parse().ok())
                .filter(|&max| max > 1)
                .unwrap_or(1);
            Some(QueueNode { name, seq, max })
        })
        .collect();
    // By sequence, never by name: names start with random prefixes.
    nodes.sort_by_key(|n| n.seq);
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_valid_name_encodes_to_one_storable_segment_and_back() {
        let names = [
            "/",
            ".",
            "..",
            "zookeeper",
            "a/b",
            "a/../b",
            "a//b",
            "%2F",
            "100%",
            "ключ",
            "锁",
            "🔒",
            "e\u{301}",
            "\u{e000}private",
            "\u{fff9}",
            "{tag}*?[]'\"`;--",
            " padded ",
        ];
        let mut seen = std::collections::HashSet::new();
        for name in names {
            let seg = encode_name(name);
            assert!(seg.starts_with(NAME_MARK), "{seg}");
            assert!(!seg.contains('/'), "{name:?} -> {seg:?}");
            assert!(!seg.chars().any(unstorable), "{name:?} -> {seg:?}");
            assert!(!matches!(seg.as_str(), "." | ".." | "zookeeper"));
            assert_eq!(decode_name(&seg).as_deref(), Some(name), "{seg}");
            assert!(seen.insert(seg), "two names share a segment");
        }
        assert_eq!(encode_name("a/b"), "_a%2Fb");
        assert_eq!(encode_name("%2F"), "_%252F");
        assert_eq!(encode_name("🔒"), "_%F0%9F%94%92");
        assert_eq!(decode_name("no-mark"), None);
        assert_eq!(decode_name("_bad%zz"), None);
        assert_eq!(decode_name("_%FF"), None);
    }

    #[test]
    fn queue_orders_by_sequence_and_skips_foreign_nodes() {
        let children = vec![
            "_c_ffff-lock-0000000003".to_string(),
            "_c_0000-lock-0000000010".to_string(),
            "_c_aaaa-lock-0000000001".to_string(),
            "operator-note".to_string(),
            "_c_bbbb-lock-".to_string(),
            "_c_cccc-lock-12x".to_string(),
        ];
        let q = queue(children);
        let seqs: Vec<i64> = q.iter().map(|n| n.seq).collect();
        assert_eq!(seqs, [1, 3, 10]);
        assert_eq!(q[0].name, "_c_aaaa-lock-0000000001");
        assert!(q.iter().all(|n| n.max == 1));
        let p = new_queue_prefix(1);
        assert!(p.starts_with("_c_") && p.ends_with(QUEUE_INFIX));
        assert!(!p.contains(PERMIT_MARK));
        assert_ne!(p, new_queue_prefix(1));
        assert_eq!(join("/", "x"), "/x");
        assert_eq!(join("/a", "x"), "/a/x");
    }

    #[test]
    fn a_permits_node_carries_its_semaphores_size() {
        let p = new_queue_prefix(3);
        assert!(p.starts_with("_c_") && p.ends_with("-sem3-lock-"), "{p}");
        let children = vec![
            format!("{p}0000000007"),
            "_c_0000-lock-0000000002".to_string(),
            "_c_1111-sem12-lock-0000000004".to_string(),
            // Not a permit's mark: taken as a lock's node.
            "_c_2222-sem1-lock-0000000005".to_string(),
            "_c_3333-semx-lock-0000000006".to_string(),
        ];
        let q = queue(children);
        let kinds: Vec<(i64, u32)> = q.iter().map(|n| (n.seq, n.max)).collect();
        assert_eq!(kinds, [(2, 1), (4, 12), (5, 1), (6, 1), (7, 3)]);
    }
}
