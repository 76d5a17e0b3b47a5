//! What the Mongo test targets share.

#![allow(dead_code)]

pub(crate) mod private_server;

/// A `$regex` that matches the strings starting with `prefix`, taken literally.
pub(crate) fn prefix_regex(prefix: &str) -> String {
    let escaped: String = prefix
        .chars()
        .flat_map(|c| {
            let special = "\\^$.|?*+()[]{}-/".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect();
    format!("^{escaped}")
}
