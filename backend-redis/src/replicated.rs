//! The server side of `sync_replicas` (see `replicas.rs`): a write sent with `WAIT` behind it on
//! the same connection, and what is done with a grant or renewal too few replicas acknowledged.

use std::time::Duration;

use distlock_api::{LockName, OwnerId, Result};
use redis::aio::ConnectionLike;
use redis::{Pipeline, ServerErrorKind, Value};

use crate::conn::Conn;
use crate::ops::{millis, Server};
use crate::replicas::{Acks, Call};

impl Server {
    /// Runs `call`, a write of a lease of `ttl`: alone, or with `sync_replicas` followed by
    /// `WAIT`. The script's reply, and how many replicas acknowledged.
    pub(crate) async fn write(
        &self,
        what: &str,
        call: Call,
        ttl: Duration,
    ) -> Result<(Value, Acks)> {
        let Some(waiting) = self.sync else {
            let mut inv = call.lua.script.prepare_invoke();
            for key in &call.keys {
                inv.key(key);
            }
            for arg in &call.args {
                inv.arg(arg);
            }
            return Ok((self.run(what, inv).await?, Acks(None)));
        };
        let timeout = waiting.timeout(ttl);
        let pipeline = |source| self::pipeline(&call, waiting.replicas, timeout, source);
        let round = self.sync_master();
        let mut conn = self.conn();
        let (reply, got) = match send(&mut conn, &pipeline).await {
            Ok(replies) => replies,
            Err(e) => {
                if self.sentinel.is_some() {
                    // As `run`: sent again to the new master only if it certainly did not run.
                    if self.follow_master(&e, round).await {
                        let mut conn = self.conn();
                        let sent = send(&mut conn, &pipeline).await;
                        sent.map_err(|e| self.error(what, e))?
                    } else {
                        return Err(self.error(what, e));
                    }
                } else {
                    if e.is_timeout() {
                        self.replace_connection();
                    }
                    return Err(self.error(what, e));
                }
            }
        };
        Ok((reply, Acks(Some((waiting.replicas, got, timeout)))))
    }

    /// After a grant of `(owner, token)` (a permit's if `permit`): if fewer replicas than asked
    /// for acknowledged it, gives it back (one hold, with its own owner and token, so nothing
    /// else is touched) and returns `Unavailable`.
    pub(crate) async fn check_grant(
        &self,
        acks: Acks,
        name: &LockName,
        (owner, token): (&OwnerId, u64),
        permit: bool,
    ) -> Result<()> {
        if !acks.short() {
            return Ok(());
        }
        let given_back = match permit {
            true => self.release_permit(name, owner, token).await,
            false => self.release(name, owner, token).await,
        };
        let why = match given_back {
            Ok(_) => "granted and given back",
            // The core's give-back of an unanswered acquire settles it.
            Err(_) => "granted; giving it back failed, it is settled in the background",
        };
        Err(acks.error(name, why).with_backend(self.backend))
    }

    /// After a renewal that took: `Unavailable` if fewer replicas than asked for acknowledged
    /// it, so the guard's safe-until does not move.
    pub(crate) fn check_renewal(&self, acks: Acks, name: &LockName) -> Result<()> {
        match acks.short() {
            true => Err(acks
                .error(name, "renewed on the master only")
                .with_backend(self.backend)),
            false => Ok(()),
        }
    }
}

/// Sends the pipeline of `EVALSHA` and `WAIT`; after `NOSCRIPT` (a restarted or flushed node,
/// a promoted replica) once more with `EVAL`, which also caches the script there.
async fn send(
    conn: &mut Conn,
    pipeline: &impl Fn(bool) -> Pipeline,
) -> redis::RedisResult<(Value, i64)> {
    let mut replies = conn.req_packed_commands(&pipeline(false), 0, 2).await?;
    let no_script = |v: &Value| matches!(v, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript));
    if replies.first().is_some_and(no_script) {
        replies = conn.req_packed_commands(&pipeline(true), 0, 2).await?;
    }
    let bad = || redis::RedisError::from((redis::ErrorKind::UnexpectedReturnType, "WAIT"));
    let [reply, acked] = <[Value; 2]>::try_from(replies).map_err(|_| bad())?;
    let reply = reply.extract_error()?;
    match acked.extract_error()? {
        Value::Int(got) => Ok((reply, got)),
        _ => Err(bad()),
    }
}

/// `call` as `EVALSHA` (or `EVAL` with the source, after `NOSCRIPT`) and `WAIT`.
fn pipeline(call: &Call, replicas: u32, timeout: Duration, source: bool) -> Pipeline {
    let mut pipe = redis::pipe();
    let script = match source {
        true => pipe.cmd("EVAL").arg(call.lua.source),
        false => pipe.cmd("EVALSHA").arg(call.lua.script.get_hash()),
    };
    script.arg(call.keys.len()).arg(&call.keys).arg(&call.args);
    pipe.cmd("WAIT").arg(replicas).arg(millis(timeout));
    pipe
}
