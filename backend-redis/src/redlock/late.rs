//! The late table: grants that finished at a majority while some masters had not answered,
//! and the per-master tokens a grant's key carries.

use std::collections::HashMap;
use std::time::Instant;

/// Grants that finished at a majority while some masters had not answered yet: grant id →
/// per-master tokens of the late grants that joined it (0: none there). Release takes the
/// entry out; an entry whose lease ran out unreleased and unrenewed is swept.
pub(super) struct LateTable {
    pub(super) next_id: u64,
    pub(super) joined: HashMap<u64, Joined>,
    pub(super) sweep_at: usize,
}

pub(super) struct Joined {
    pub(super) tokens: Vec<u64>,
    /// After this, no master can still hold the grant: its last lease plus the longest a late
    /// answer can take (the response timeout).
    pub(super) until: Instant,
}

impl Default for LateTable {
    fn default() -> Self {
        Self {
            next_id: 0,
            joined: HashMap::new(),
            sweep_at: 64,
        }
    }
}

impl LateTable {
    pub(super) fn open(&mut self, n: usize, until: Instant) -> u64 {
        if self.joined.len() >= self.sweep_at {
            // Guards are always released, so only a caller of the raw trait that drops grants
            // leaves entries behind; sweeping at doubling sizes keeps that bounded and cheap.
            let now = Instant::now();
            self.joined.retain(|_, j| j.until > now);
            self.sweep_at = (self.joined.len() * 2).max(64);
        }
        self.next_id += 1;
        let id = self.next_id;
        self.joined.insert(
            id,
            Joined {
                tokens: vec![0; n],
                until,
            },
        );
        id
    }
}

/// The per-master tokens of a grant, kept in [`Grant::key`] as `t1,t2,…` (0: not held there),
/// so release and renew check each master's own token, followed by `;id` when late grants may
/// join it (see [`LateTable`]).
pub(super) fn encode_key(tokens: &[u64], id: Option<u64>) -> String {
    let mut key = tokens
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    if let Some(id) = id {
        key.push(';');
        key.push_str(&id.to_string());
    }
    key
}

pub(super) fn decode_key(key: &str, n: usize) -> Option<(Vec<u64>, Option<u64>)> {
    let (tokens, id) = match key.split_once(';') {
        Some((t, id)) => (t, Some(id.parse().ok()?)),
        None => (key, None),
    };
    let tokens = tokens
        .split(',')
        .map(|t| t.parse().ok())
        .collect::<Option<Vec<u64>>>()?;
    (tokens.len() == n).then_some((tokens, id))
}
