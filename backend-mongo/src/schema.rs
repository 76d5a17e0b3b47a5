//! The lock collection's shape: one refused if its default collation is not binary.

use distlock_api::{Error, Result};
use mongodb::bson::{doc, Bson};

use crate::error::{command_code, map_err};
use crate::BACKEND;

/// Refuses a collection whose default collation is not the binary one.
pub(crate) async fn check_collation(db: &mongodb::Database, collection: &str) -> Result<()> {
    let reply = db
        .run_command(doc! {
            "listCollections": 1,
            "filter": { "name": collection },
            "authorizedCollections": true,
        })
        .await;
    let reply = match reply {
        Ok(r) => r,
        // Without the privilege to list collections the check cannot run; locking still works.
        Err(e) if command_code(&e) == Some(13) => return Ok(()),
        Err(e) => return Err(map_err(e, "cannot list the lock collection")),
    };
    let spec = reply
        .get_document("cursor")
        .ok()
        .and_then(|c| c.get_array("firstBatch").ok())
        .and_then(|b| b.first())
        .and_then(Bson::as_document);
    let Some(spec) = spec else {
        // Created on first use, with the simple (binary) collation.
        return Ok(());
    };
    if spec.get_str("type").is_ok_and(|t| t != "collection") {
        return Err(Error::invalid(format!(
            "{:?} is a {}, not a collection",
            collection,
            spec.get_str("type").unwrap_or("?")
        ))
        .with_backend(BACKEND));
    }
    let locale = spec
        .get_document("options")
        .ok()
        .and_then(|o| o.get_document("collation").ok())
        .and_then(|c| c.get_str("locale").ok());
    match locale {
        None | Some("simple") => Ok(()),
        Some(locale) => Err(Error::invalid(format!(
            "the lock collection {collection:?} has the default collation {locale:?}, which can \
             merge names that differ in case or accents; use a collection with the simple \
             (binary) collation"
        ))
        .with_backend(BACKEND)),
    }
}
