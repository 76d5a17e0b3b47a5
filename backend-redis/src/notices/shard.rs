//! Release notices on Redis Cluster: shard channels (`SSUBSCRIBE`) on a cluster connection of
//! the hub's own, whose pushes a reader hands to the channels' waiters.

use std::sync::Weak;

use distlock_api::{Error, ErrorKind, Result};
use tokio::sync::mpsc;

use super::{lock, Conn, Kick, Manager, Shared, Sink};
use crate::ops::driver_error;

impl Manager {
    /// A cluster connection of its own (RESP3, its pushes to a reader) for shard channels.
    pub(super) async fn connect_cluster(&mut self) -> Result<()> {
        let c = &self.config;
        let Some((spec, options)) = &c.cluster else {
            return Ok(());
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let connecting = async {
            let client = spec.client(options, Some(tx)).await?;
            client.get_async_connection().await
        };
        let limit = c.connect_timeout + c.response_timeout;
        let conn = match tokio::time::timeout(limit, connecting).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(driver_error(c.backend, &c.endpoint, "pub/sub connect", e)),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "pub/sub connect to {} took longer than {limit:?}",
                        c.endpoint.display
                    ),
                )
                .with_backend(c.backend))
            }
        };
        self.generation += 1;
        let reader = tokio::spawn(read_pushes(
            self.shared.clone(),
            rx,
            self.generation,
            self.kick_sender(),
        ));
        self.conn = Some(Conn {
            sink: Sink::Cluster(conn),
            reader,
        });
        Ok(())
    }
}

/// The cluster connection's reader: shard messages to their channel's waiters; a node's
/// connection lost (the driver reconnects and subscribes again) wakes every waiter, as a
/// message may have been lost; a shard channel the server dropped (its slot moved) wakes its
/// waiters and is subscribed again.
pub(super) async fn read_pushes(
    shared: Weak<Shared>,
    mut pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
    generation: u64,
    kick: Option<mpsc::WeakUnboundedSender<Kick>>,
) {
    use redis::PushKind;
    while let Some(push) = pushes.recv().await {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let channel = push
            .data
            .first()
            .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok());
        let st = lock(&shared.state);
        match (push.kind, channel) {
            (PushKind::SMessage | PushKind::Message, Some(channel)) => {
                if let Some(ch) = st.channels.get(&channel) {
                    ch.events.send_modify(|n| *n += 1);
                }
            }
            (PushKind::SUnsubscribe, Some(channel)) => {
                if let Some(ch) = st.channels.get(&channel) {
                    ch.events.send_modify(|n| *n += 1);
                    if let Some(kick) = kick.as_ref().and_then(|k| k.upgrade()) {
                        let _ = kick.send(Kick::Dropped(channel));
                    }
                }
            }
            (PushKind::Disconnection, _) => {
                for ch in st.channels.values() {
                    ch.events.send_modify(|n| *n += 1);
                }
            }
            _ => {}
        }
    }
    if let Some(kick) = kick.and_then(|k| k.upgrade()) {
        let _ = kick.send(Kick::Disconnected(generation));
    }
}
