//! The peer list, URLs and the skipped-peer rule.

use super::*;

#[test]
fn ids_round_trip_and_name_their_server() {
    for lib in Library::ALL {
        assert_eq!(Library::from_id(lib.id()), Some(lib));
    }
    assert_eq!(Library::from_id("redis"), None);
    assert_eq!(Library::Curator.against(), Kind::Zk);
    assert_eq!(Library::EtcdGo.against(), Kind::Etcd);
    assert_eq!(Library::PythonRedisLock.against(), Kind::Redis);
}

#[test]
fn server_urls_become_what_each_client_takes() {
    assert_eq!(hosts("zk://127.0.0.1:2181", true), "127.0.0.1:2181");
    assert_eq!(hosts("zk://a:1,b:2/chroot?x=1", true), "a:1,b:2/chroot");
    assert_eq!(hosts("etcd://127.0.0.1:2379/", false), "127.0.0.1:2379");
    assert_eq!(hosts("etcd://a:1,b:2/prefix", false), "a:1,b:2");
    assert_eq!(
        driver_url("redis://127.0.0.1:6379/0?ttl=5s"),
        "redis://127.0.0.1:6379/0"
    );
}

#[test]
fn versions_are_read_from_cargo_lock() {
    let lock = "[[package]]\nname = \"redis\"\nversion = \"1.8.1\"\n\n\
                [[package]]\nname = \"rslock\"\nversion = \"0.10.0\"\nsource = \"x\"\n";
    assert_eq!(locked_version(lock, "rslock").as_deref(), Some("0.10.0"));
    assert_eq!(locked_version(lock, "redis").as_deref(), Some("1.8.1"));
    assert_eq!(locked_version(lock, "tokio"), None);
    // The real one names the rslock this bench is built with.
    assert!(rslock_version().starts_with("0.10"), "{}", rslock_version());
}

#[test]
fn a_peer_not_installed_is_skipped_with_the_reason() {
    let dir = std::env::temp_dir().join(format!("distlock-peers-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let reason = |lib| launch(lib, &dir, "zk://127.0.0.1:2181").err();
    for lib in [Library::Curator, Library::EtcdGo, Library::RedisPy] {
        assert_eq!(reason(lib).as_deref(), Some(NOT_INSTALLED), "{lib:?}");
    }
    std::fs::write(
        dir.join("etcd-go.skipped"),
        "go build failed (see install.log)\n",
    )
    .unwrap();
    assert_eq!(
        reason(Library::EtcdGo).as_deref(),
        Some("could not be installed: go build failed (see install.log)")
    );
    assert!(reason(Library::Rslock).is_none(), "rslock is a dependency");
    std::fs::remove_dir_all(&dir).unwrap();
}
