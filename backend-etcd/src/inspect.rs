//! What a client tells of the locks on the server, and what it takes away without a guard:
//! the holder of a name and the held names under a prefix (the oldest entry of each, with a
//! semaphore's count), an operator's forced release of one grant, and the give-back of a hold
//! a lost answer may have left.

use std::sync::Arc;
use std::time::Instant;

use distlock_api::backend::Surplus;
use distlock_api::{Error, ErrorKind, FencingToken, Grant, LockInfo, LockName, Result};
use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, SortOrder, Txn, TxnOp};

use crate::holds::{entries, lock, range_count, range_result, Shared};
use crate::keys;

impl Shared {
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        Ok(self.holder(name).await?.map(|(_, info)| info))
    }

    /// The holder's key and what it says: the entry with the lowest create revision in the
    /// lock's directory; for a semaphore, its oldest permit, with how many of its entries hold
    /// one (the oldest `max`: every entry, up to `max`); and the leader value proclaimed under
    /// the holder's token, read in the same transaction (one revision). etcd keeps no time
    /// with a key, so `since` stays unknown.
    async fn holder(&self, name: &LockName) -> Result<Option<(String, LockInfo)>> {
        let dir = keys::lock_dir(&self.config.key_prefix, name.as_str());
        let value_key = keys::value_key(&self.config.key_prefix, name.as_str());
        let read = Txn::new().and_then([
            TxnOp::get(dir.as_str(), Some(entries(SortOrder::Ascend).with_limit(1))),
            TxnOp::get(value_key.as_str(), None),
        ]);
        let resp = self.txn("inspecting", read).await?;
        // The count is of the whole directory, whatever the limit.
        let entries = range_count(&resp, 0)?;
        let Some(holder) = range_result(&resp, 0)?.into_iter().next() else {
            return Ok(None);
        };
        let stored = range_result(&resp, 1)?.into_iter().next();
        let unexpected = || {
            Error::new(
                ErrorKind::Backend,
                format!(
                    "unexpected key {:?} in the lock's directory",
                    String::from_utf8_lossy(holder.key())
                ),
            )
        };
        let entry = keys::parse_entry(&dir, holder.key()).ok_or_else(unexpected)?;
        let hold_count = std::str::from_utf8(holder.value())
            .ok()
            .and_then(|v| v.parse().ok())
            .ok_or_else(unexpected)?;
        let key = String::from_utf8_lossy(holder.key()).into_owned();
        let token = FencingToken(holder.create_revision().unsigned_abs());
        let mut info = LockInfo::new(entry.owner, hold_count, token, None);
        // A value proclaimed under an earlier grant of the name is not this holder's.
        let proclaimed = stored
            .as_ref()
            .and_then(|kv| keys::decode_value(kv.value()));
        if let Some((_, value)) = proclaimed.filter(|&(epoch, _)| epoch == holder.create_revision())
        {
            info = info.with_value(value);
        }
        if entry.max > 1 {
            let held = u32::try_from(entries).unwrap_or(u32::MAX).min(entry.max);
            info = info.with_permits(held, entry.max);
        }
        Ok(Some((key, info)))
    }

    /// Every held lock whose name starts with `prefix`: one keys-only range read of their
    /// directories, then each holder as [`inspect`](Self::inspect) reads it.
    pub(crate) async fn list(&self, prefix: &str) -> Result<Vec<(LockName, LockInfo)>> {
        let root = format!("{}/", self.config.key_prefix);
        let range = format!("{root}{}", keys::encode_name(prefix));
        let resp = self
            .call("listing", |c| {
                let range = range.clone();
                async move {
                    let options = GetOptions::new().with_prefix().with_keys_only();
                    c.kv_client().get(range, Some(options)).await
                }
            })
            .await?;
        let mut names: Vec<LockName> = resp
            .kvs()
            .iter()
            .filter_map(|kv| {
                let rest = std::str::from_utf8(kv.key()).ok()?.strip_prefix(&root)?;
                let (segment, _) = rest.split_once('/')?;
                LockName::new(keys::decode_name(segment)?).ok()
            })
            .collect();
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        let mut held = Vec::new();
        for name in names {
            if let Some((_, info)) = self.holder(&name).await? {
                held.push((name, info));
            }
        }
        Ok(held)
    }

    /// Writes `value` as the leader value of `grant`'s name, stamped with its token, in one
    /// transaction that writes only while `grant`'s key exists with its token as create
    /// revision: the key of a live lease (etcd deletes a lease's keys as it ends it), and the
    /// oldest entry of the name since it was granted. The value key is put on the same lease,
    /// so it goes when the leader's client does. `false` if the grant no longer holds (or is
    /// not one this client made for its owner).
    pub(crate) async fn proclaim(self: &Arc<Self>, grant: &Grant, value: &str) -> Result<bool> {
        let Some(slot) = self.slot_of(grant) else {
            return Ok(false);
        };
        if !slot.holds().held_by(grant.token) {
            return Ok(false);
        }
        drop(slot);
        let (Ok(token), Some(lease_id)) =
            (i64::try_from(grant.token.0), keys::lease_of(&grant.key))
        else {
            return Ok(false);
        };
        let value_key = keys::value_key(&self.config.key_prefix, grant.name.as_str());
        let txn = Txn::new()
            .when([Compare::create_revision(
                grant.key.as_str(),
                CompareOp::Equal,
                token,
            )])
            .and_then([TxnOp::put(
                value_key,
                keys::encode_value(token, value),
                Some(PutOptions::new().with_lease(lease_id)),
            )]);
        Ok(self.txn("proclaiming", txn).await?.succeeded())
    }

    /// Deletes the key of the grant of `token` (the entry of that create revision, while it
    /// holds: the lock's oldest entry, or one of a semaphore's `max` oldest) in a transaction
    /// conditional on its create revision; the waiters are then told, and the holder's next
    /// renewal finds its key gone.
    pub(crate) async fn force_release(&self, name: &LockName, token: FencingToken) -> Result<bool> {
        let Ok(revision) = i64::try_from(token.0) else {
            return Ok(false);
        };
        if revision < 2 {
            // No key has it: revision 1 is the empty store's.
            return Ok(false);
        }
        let dir = keys::lock_dir(&self.config.key_prefix, name.as_str());
        let its_entry = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_min_create_revision(revision)
            .with_max_create_revision(revision);
        // The entries older than it, enough of them to tell whether it holds (etcd limits a
        // filtered read after filtering).
        let older = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_max_create_revision(revision - 1)
            .with_limit(i64::from(distlock_api::MAX_PERMITS));
        let read = Txn::new().and_then([
            TxnOp::get(dir.as_str(), Some(its_entry)),
            TxnOp::get(dir.as_str(), Some(older)),
        ]);
        let resp = self.txn("finding the grant", read).await?;
        let Some(found) = range_result(&resp, 0)?.into_iter().next() else {
            return Ok(false);
        };
        let Some(entry) = keys::parse_entry(&dir, found.key()) else {
            return Ok(false);
        };
        // Its rank only falls from here on: a holder now holds until deleted.
        let ahead = range_result(&resp, 1)?.len();
        if ahead >= entry.max as usize {
            return Ok(false);
        }
        let key = String::from_utf8_lossy(found.key()).into_owned();
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        Ok(self.txn("force-releasing", txn).await?.succeeded())
    }

    /// Gives back one hold of `surplus.owner`'s on its name that this handle does not account
    /// for, through the owner's own entry made by this client (the lock's, or the owner's
    /// permit, which `inspect` may not show), read for its hold count.
    pub(crate) async fn give_back(self: &Arc<Self>, surplus: &Surplus) -> Result<bool> {
        let dir = keys::lock_dir(&self.config.key_prefix, surplus.name.as_str());
        let own: Vec<(String, u32)> = lock(&self.slots)
            .keys()
            .filter_map(|key| {
                let entry = keys::parse_entry(&dir, key.as_bytes())?;
                (entry.owner == surplus.owner).then(|| (key.clone(), entry.max))
            })
            .collect();
        for (key, max) in own {
            let get = |c: Client| {
                let key = key.clone();
                async move { c.kv_client().get(key, None).await }
            };
            let resp = self.call("reading the owner's entry", get).await?;
            let Some(kv) = resp.kvs().first() else {
                continue;
            };
            let count = std::str::from_utf8(kv.value())
                .ok()
                .and_then(|v| v.parse::<u32>().ok());
            let Some(count) = count.filter(|&c| self.core.has_surplus(surplus, c)) else {
                continue;
            };
            let token = FencingToken(kv.create_revision().unsigned_abs());
            let mut grant = Grant::new(
                surplus.name.clone(),
                surplus.owner.clone(),
                token,
                count,
                surplus.ttl,
                Instant::now(),
            )
            .with_key(key);
            grant.permits = max;
            return self.release(&grant).await;
        }
        Ok(false)
    }
}
