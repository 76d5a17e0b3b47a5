//! A backend's test-only admin surface: what the conformance suite does to a server behind the
//! client's back, and what it asks the server to check that nothing was left behind. Backends
//! implement [`Admin`] behind their `testing` feature, so it never ships in a build that does
//! not ask for it; the suite's harness is then the backend's descriptor plus its admin.

use async_trait::async_trait;
use futures::future::BoxFuture;

use crate::error::Result;
use crate::name::LockName;

/// Acts on a backend's server directly, as an operator, a failover or a crash would.
#[async_trait]
pub trait Admin: Send + Sync {
    /// Removes `name`'s current holder behind its back (deletes the key, row, document or
    /// node). The holder's guard must then report lost at its next renewal.
    async fn remove_holder(&self, name: &LockName) -> Result<()>;

    /// How many waiters the server has queued for `name` (queue nodes or keys other than the
    /// holder's, subscribers of its release channel). `None` where the backend keeps no waiter
    /// state on the server (polling ones).
    async fn waiters(&self, name: &LockName) -> Result<Option<usize>> {
        let _ = name;
        Ok(None)
    }

    /// What the server still keeps for names starting with `prefix` (lock keys, rows, nodes,
    /// waiters), described for a failure message; empty when nothing is left.
    async fn leftovers(&self, prefix: &str) -> Result<Vec<String>>;
}

/// Makes the admin of the server(s) at a URL.
pub type AdminFn = fn(String) -> BoxFuture<'static, Result<std::sync::Arc<dyn Admin>>>;

/// The methods of the `DistributedLock` trait (read from `trait_src`, the text of
/// `lock-api/src/lock.rs`) that the `impl DistributedLock for <wrapper>` in `impl_src` does not
/// define. A wrapper that forwards all but one falls back to the trait's default for it, which
/// is right only for some backends, and silently changes the wrapped backend's behaviour: a
/// wrapper's test asserts this is empty.
pub fn missing_forwards(trait_src: &str, impl_src: &str, wrapper: &str) -> Vec<String> {
    fn fn_names(block: &str) -> Vec<String> {
        block
            .lines()
            .filter_map(|l| {
                let l = l.trim_start();
                let l = l.strip_prefix("async ").unwrap_or(l);
                let rest = l.strip_prefix("fn ")?;
                let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
                Some(rest[..end].to_string())
            })
            .collect()
    }
    // The block from `start` to the first line that is exactly "}".
    fn block<'a>(src: &'a str, start: &str) -> &'a str {
        let Some(at) = src.find(start) else {
            return "";
        };
        let body = &src[at..];
        let end = body.find("\n}\n").map_or(body.len(), |e| e + 2);
        &body[..end]
    }
    let wanted = fn_names(block(trait_src, "pub trait DistributedLock"));
    let have = fn_names(block(
        impl_src,
        &format!("impl DistributedLock for {wrapper}"),
    ));
    wanted.into_iter().filter(|m| !have.contains(m)).collect()
}
