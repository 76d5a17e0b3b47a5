//! The README's backend × capability table, generated from the backends' own values.

use distlock_api::{Blocking, Capabilities, Fencing, LeaseKind};

/// The capability table of every backend this build includes, as Markdown. The README carries
/// the table of a build with every feature, and a test keeps the two equal.
pub fn capability_table() -> String {
    let rows: Vec<(&str, Capabilities)> = crate::connect::backends()
        .into_iter()
        .map(|d| (d.label, d.capabilities))
        .collect();
    let mut out = String::from(
        "| backend | reentrant | waiting | lease | fair (FIFO) | fencing token | watchdog renewal | semaphore | election |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for (name, c) in rows {
        let yes = |b: bool| if b { "yes" } else { "no" };
        // The enums are non-exhaustive: a kind added later shows as declared.
        let blocking = match c.blocking {
            Blocking::Notify => "notified".to_string(),
            Blocking::Poll => "polls (backoff + jitter)".to_string(),
            Blocking::Signal => "signalled by the server, else polls".to_string(),
            other => format!("{other:?}"),
        };
        let lease = match c.ttl.kind {
            LeaseKind::None => "none".to_string(),
            LeaseKind::PerLock => format!("per lock, ≥ {:?}", c.ttl.min),
            LeaseKind::Session => format!("session, ≥ {:?}", c.ttl.min),
            other => format!("{other:?}, ≥ {:?}", c.ttl.min),
        };
        let fencing = match c.fencing {
            Fencing::None => "no".to_string(),
            Fencing::Volatile => "yes (volatile)".to_string(),
            Fencing::Durable => "yes (durable)".to_string(),
            other => format!("yes ({other:?})"),
        };
        out.push_str(&format!(
            "| {name} | {} | {blocking} | {lease} | {} | {fencing} | {} | {} | {} |\n",
            yes(c.reentrant),
            yes(c.fair),
            yes(c.renewal),
            yes(c.semaphore),
            yes(c.election)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    /// The README's table must be what the code says, for a build with every backend.
    #[test]
    #[cfg(all(
        feature = "redis",
        feature = "mysql",
        feature = "postgres",
        feature = "mongo",
        feature = "zk",
        feature = "etcd"
    ))]
    fn readme_table_matches_the_capabilities() {
        let readme = include_str!("../../README.md");
        let table = super::capability_table();
        assert!(
            readme.contains(&table),
            "README.md's capability table is out of date; it should read:\n{table}"
        );
    }
}
