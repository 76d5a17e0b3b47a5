//! The test-only admin of the MongoDB backend (feature `testing`): operations on the client's
//! own lock collection.

use std::sync::Arc;

use distlock_api::backend::async_trait;
use distlock_api::backend::testing::Admin;
use distlock_api::{Error, LockName, Result};
use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};

use crate::{fields, MongoConfig, MongoLock};

fn failed(what: &str, e: mongodb::error::Error) -> Error {
    Error::unavailable(what.to_string(), e)
}

/// A regular expression matching names that start with `prefix`.
fn prefix_regex(prefix: &str) -> String {
    let escaped: String = prefix
        .chars()
        .flat_map(|c| {
            let special = "\\^$.|?*+()[]{}-/".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect();
    format!("^{escaped}")
}

#[async_trait]
impl Admin for MongoLock {
    /// Clears the holder (and every permit) the way an operator would, keeping the fencing counter: deleting the
    /// document would also restart the counter, which the backend's docs forbid.
    async fn remove_holder(&self, name: &LockName) -> Result<()> {
        let clear = doc! {
            "$set": {
                fields::OWNER: Bson::Null, fields::COUNT: 0_i64, fields::EXPIRES_AT: Bson::Null,
                fields::PERMITS: [],
            }
        };
        self.collection()
            .update_one(doc! { "_id": name.as_str() }, clear)
            .await
            .map_err(|e| failed("clearing the holder", e))?;
        Ok(())
    }

    /// Any document of names starting with `prefix` that still names an owner or has a
    /// permit, live or expired: a release clears the owner, and so does the release of a guard that outlived
    /// its lease.
    async fn leftovers(&self, prefix: &str) -> Result<Vec<String>> {
        let filter = doc! {
            "_id": { "$regex": prefix_regex(prefix) },
            "$or": [
                { fields::OWNER: { "$ne": Bson::Null } },
                { format!("{}.0", fields::PERMITS): { "$exists": true } },
            ],
        };
        let docs: Vec<Document> = self
            .collection()
            .find(filter)
            .await
            .map_err(|e| failed("listing held documents", e))?
            .try_collect()
            .await
            .map_err(|e| failed("listing held documents", e))?;
        Ok(docs.iter().map(|d| format!("{d}")).collect())
    }
}

/// The admin of the server at `url` (a [`MongoLock`] client of it).
pub async fn admin(url: String) -> Result<Arc<dyn Admin>> {
    Ok(Arc::new(
        MongoLock::connect(MongoConfig::from_url(&url)?).await?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_regex_escapes_what_regexes_treat_specially() {
        assert_eq!(prefix_regex("dlc-a.b"), "^dlc\\-a\\.b");
    }
}
