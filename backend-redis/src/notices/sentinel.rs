//! Release notices through Sentinel: the connection goes to the master the sentinels name, and
//! is dropped (every waiter woken, every channel subscribed again on the new master) when the
//! client's command connection moves to another master.

use distlock_api::Result;

use super::{Kick, Manager};

impl Manager {
    /// The next kick: a waiter's change, a dropped connection, the retry timer, or (with
    /// Sentinel) the master moving.
    pub(super) async fn next_kick(&mut self) -> Option<Kick> {
        let (kicks, retry_in) = (&mut self.kicks, self.retry_in);
        let next = async move {
            match retry_in {
                Some(delay) => match tokio::time::timeout(delay, kicks.recv()).await {
                    Ok(k) => k,
                    Err(_) => Some(Kick::Changed),
                },
                None => kicks.recv().await,
            }
        };
        match &mut self.master_moves {
            None => next.await,
            Some(moves) => tokio::select! {
                kick = next => kick,
                Ok(()) = moves.changed() => Some(Kick::MasterMoved),
            },
        }
    }

    /// The command connection moved to another master: a connection to the old one hears no
    /// more releases, so it is dropped and the wanted channels are subscribed on the new one.
    pub(super) fn follow_master(&mut self) {
        let Some(moves) = &self.master_moves else {
            return;
        };
        let now = moves.borrow().clone();
        if self.conn.is_some() && self.conn_master.as_deref() != Some(now.as_str()) {
            self.drop_connection();
        }
    }

    /// A pub/sub connection to the master the sentinels name now.
    pub(super) async fn connect_sentinel(&mut self) -> Result<()> {
        let Some(sentinel) = self.config.sentinel.clone() else {
            return Ok(());
        };
        let master = sentinel.find_master().await?;
        self.connect_to(&master).await?;
        self.conn_master = Some(master.client.get_connection_info().addr().to_string());
        // The command connection follows before its next call.
        sentinel.moved_to(&master);
        Ok(())
    }
}
