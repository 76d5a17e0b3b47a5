//! Every wrapper of a backend in the workspace forwards every method of the trait: one that
//! leaves a method to the trait's default silently changes the wrapped backend's behaviour.
//! A wrapper is an `impl DistributedLock` whose `core` is another lock's.

use std::path::{Path, PathBuf};

use distlock_api::backend::testing::missing_forwards;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            if name != "target" && !name.to_string_lossy().starts_with('.') {
                sources(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The wrappers in `src`: the types of its `impl DistributedLock for` blocks whose `core` is
/// another lock's.
fn wrappers(src: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in src.match_indices("impl DistributedLock for ") {
        let rest = &src[at + "impl DistributedLock for ".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let block = &rest[..rest.find("\n}\n").unwrap_or(rest.len())];
        if block.contains("self.inner.core()") || block.contains("self.0.core()") {
            found.push(name);
        }
    }
    found
}

#[test]
fn every_wrapper_in_the_workspace_forwards_every_method() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let trait_src = std::fs::read_to_string(root.join("lock-api/src/lock.rs")).unwrap();
    let mut files = Vec::new();
    sources(root, &mut files);
    let mut checked = Vec::new();
    let mut missing = Vec::new();
    for file in files {
        if file.ends_with("lock-api/tests/wrappers.rs") {
            continue; // its own test wrapper is text in a string
        }
        let src = std::fs::read_to_string(&file).unwrap();
        for wrapper in wrappers(&src) {
            let left = missing_forwards(&trait_src, &src, &wrapper);
            if !left.is_empty() {
                missing.push(format!("{wrapper} ({}): {left:?}", file.display()));
            }
            checked.push(wrapper);
        }
    }
    // The bench's counting wrapper, the suite's watched memory client and this crate's test
    // wrappers at least: a scan that finds none is broken.
    assert!(checked.len() >= 5, "found only {checked:?}");
    assert!(
        missing.is_empty(),
        "wrappers leave methods to the defaults: {missing:#?}"
    );
}

#[test]
fn a_wrapper_that_leaves_a_method_to_its_default_is_flagged() {
    let trait_src =
        "pub trait DistributedLock {\n    fn profile(&self);\n    fn core(&self);\n    \
                     async fn give_back(&self);\n}\n";
    let wrapper = "impl DistributedLock for W {\n    fn profile(&self) {}\n    fn core(&self) \
                   { self.inner.core() }\n}\n";
    assert_eq!(wrappers(wrapper), ["W"]);
    assert_eq!(missing_forwards(trait_src, wrapper, "W"), ["give_back"]);
}
