//! The sentinels' `+switch-master` events: a client hears of a failover as soon as a sentinel
//! announces it, rather than when the old master fails its next call. This matters most for a
//! manual failover (`SENTINEL FAILOVER`), where the old master keeps accepting writes until
//! Sentinel demotes it, some seconds after the promotion.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;

use super::Sentinel;

/// How long to wait before listening on the next sentinel after one failed or went away.
const RELISTEN: Duration = Duration::from_millis(200);

impl Sentinel {
    /// Listens to one sentinel at a time (the next one when it goes away) for
    /// `+switch-master` of this master, and records the new master at once. Ends when the
    /// client is gone (`stop`'s sender, held by the client, dropped).
    pub(crate) fn listen_for_switches(self: &Arc<Self>, mut stop: watch::Receiver<()>) {
        let this = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut next = 0usize;
            loop {
                tokio::select! {
                    () = listen(&this, next) => {}
                    _ = stop.changed() => return,
                }
                let Some(count) = this.upgrade().map(|s| s.spec.sentinels.len()) else {
                    return;
                };
                next = (next + 1) % count.max(1);
                tokio::select! {
                    () = tokio::time::sleep(RELISTEN) => {}
                    _ = stop.changed() => return,
                }
            }
        });
    }
}

/// Listens on sentinel `index` until its connection ends.
async fn listen(this: &Weak<Sentinel>, index: usize) {
    let (client, timeout, master) = {
        let Some(s) = this.upgrade() else { return };
        let Some(sentinel) = s.spec.sentinels.get(index) else {
            return;
        };
        (
            sentinel.client.clone(),
            s.connect_timeout,
            s.spec.master.clone(),
        )
    };
    let Ok(Ok(mut pubsub)) = tokio::time::timeout(timeout, client.get_async_pubsub()).await else {
        return;
    };
    if !matches!(
        tokio::time::timeout(timeout, pubsub.subscribe("+switch-master")).await,
        Ok(Ok(()))
    ) {
        return;
    }
    let mut messages = pubsub.on_message();
    while let Some(msg) = messages.next().await {
        // `<master-name> <old-ip> <old-port> <new-ip> <new-port>`
        let Ok(text) = msg.get_payload::<String>() else {
            continue;
        };
        let fields: Vec<&str> = text.split(' ').collect();
        let [name, _, _, host, port] = fields[..] else {
            continue;
        };
        if name != master {
            continue;
        }
        let Some(s) = this.upgrade() else { return };
        if let Some(node) = port
            .parse()
            .ok()
            .and_then(|port| s.spec.node.at(host, port).ok())
        {
            s.moved_to(&node);
        }
    }
}
