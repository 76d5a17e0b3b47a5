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

#[cfg(test)]
mod tests {
    use super::*;

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
