//! Redis Cluster's slots: which slot a key hashes to (CRC16 of its hash tag, as the cluster
//! specification defines it) and which slots each primary of the campaign's cluster starts with.

/// How many slots a Redis Cluster has.
const SLOTS: u32 = 16384;

/// The slot of `key`: CRC16 (XMODEM) of the part between the first `{` and the next `}` if that
/// part is not empty, else of the whole key, modulo 16384.
pub(crate) fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tag = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(bytes);
    (u32::from(crc16(tag)) % SLOTS) as u16
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The slots primary `p` of `primaries` owns when the cluster starts: an even share, in order.
pub(crate) fn initial_slots(p: usize, primaries: usize) -> std::ops::RangeInclusive<u16> {
    let start = |p: usize| (p as u32 * SLOTS / primaries as u32) as u16;
    let end = if p + 1 == primaries {
        (SLOTS - 1) as u16
    } else {
        start(p + 1) - 1
    };
    start(p)..=end
}

/// Who serves a slot now, by address (`ip`, as each node announces itself).
#[derive(Debug, PartialEq)]
pub(crate) struct Shard {
    /// The primary that owns the slot.
    pub(crate) primary: String,
    /// A replica of that primary.
    pub(crate) replica: String,
    /// The other primaries, sorted (each node lists the nodes in an order of its own): a slot
    /// migration moves the slot to the first.
    pub(crate) others: Vec<String>,
}

/// The shard serving `slot` in a `CLUSTER NODES` answer (one node a line: id, `ip:port@bus`,
/// flags, the id of its primary or `-`, four fields more, then its slots as `n` or `lo-hi`, and
/// `[n->-id]` while migrating): a primary not flagged `fail` whose slots hold `slot`, a replica
/// of it and the other primaries not flagged `fail` (at least one); `None` while the answer names no such shard (a
/// failover under way).
pub(crate) fn shard_in(nodes: &str, slot: u16) -> Option<Shard> {
    let rows: Vec<Vec<&str>> = nodes
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() >= 8)
        .collect();
    let ip = |f: &[&str]| f[1].split(':').next().unwrap_or_default().to_string();
    let flagged = |f: &[&str], flag: &str| f[2].split(',').any(|x| x == flag);
    let live_primary = |f: &[&str]| flagged(f, "master") && !flagged(f, "fail");
    let owns = |f: &[&str]| {
        f[8..].iter().filter(|r| !r.starts_with('[')).any(|r| {
            let (lo, hi) = r.split_once('-').unwrap_or((r, r));
            matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if (lo..=hi).contains(&slot))
        })
    };
    let primary = rows.iter().find(|f| live_primary(f) && owns(f))?;
    let replica = rows
        .iter()
        .find(|f| flagged(f, "slave") && !flagged(f, "fail") && f[3] == primary[0])?;
    let mut others: Vec<String> = rows
        .iter()
        .filter(|f| live_primary(f) && f[0] != primary[0])
        .map(|f| ip(f))
        .collect();
    others.sort();
    (!others.is_empty()).then(|| Shard {
        primary: ip(primary),
        replica: ip(replica),
        others,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shard_of_a_slot_is_read_from_cluster_nodes() {
        // After a failover of the first shard: node b (10.0.0.4) was promoted, a (10.0.0.1)
        // rejoined as its replica; a slot of the second shard is being migrated.
        let nodes = "\
aaaa 10.0.0.1:6379@16379 slave bbbb 0 1 7 connected
bbbb 10.0.0.4:6379@16379 myself,master - 0 0 7 connected 0-5460
cccc 10.0.0.2:6379@16379 master - 0 1 2 connected 5461-10921 [5470->-dddd]
dddd 10.0.0.3:6379@16379 master - 0 1 3 connected 10922-16383
eeee 10.0.0.5:6379@16379 slave cccc 0 1 2 connected
ffff 10.0.0.6:6379@16379 slave dddd 0 1 3 connected
";
        let shard = |primary: &str, replica: &str, others: [&str; 2]| Shard {
            primary: primary.into(),
            replica: replica.into(),
            others: others.map(String::from).to_vec(),
        };
        let want = shard("10.0.0.4", "10.0.0.1", ["10.0.0.2", "10.0.0.3"]);
        assert_eq!(shard_in(nodes, 0), Some(want));
        assert_eq!(
            shard_in(nodes, 5470),
            Some(shard("10.0.0.2", "10.0.0.5", ["10.0.0.3", "10.0.0.4"]))
        );
        assert_eq!(
            shard_in(nodes, 16383),
            Some(shard("10.0.0.3", "10.0.0.6", ["10.0.0.2", "10.0.0.4"]))
        );
        // While the primary is failed and its replica not yet promoted, no shard serves.
        let failing = nodes.replace("myself,master", "master,fail");
        assert_eq!(shard_in(&failing, 0), None);
        assert_eq!(shard_in("", 0), None);
    }

    #[test]
    fn slots_are_those_redis_computes() {
        // CRC16/XMODEM's check value, and slots `CLUSTER KEYSLOT` gives.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("somekey"), 11058);
        assert_eq!(key_slot("foo{hash_tag}"), 2515);
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        // An empty tag does not count: the whole key is hashed.
        assert_eq!(key_slot("{}foo"), crc16(b"{}foo") % 16384);
    }

    #[test]
    fn the_primaries_share_every_slot_once() {
        let ranges: Vec<_> = (0..3).map(|p| initial_slots(p, 3)).collect();
        assert_eq!(ranges, vec![0..=5460, 5461..=10921, 10922..=16383]);
    }
}
