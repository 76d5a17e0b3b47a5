use std::time::Duration;

use distlock_api::ErrorKind;

use crate::RedisConfig;

#[test]
fn sentinel_urls_name_the_sentinels_and_the_master() {
    let c = RedisConfig::from_url(
        "redis+sentinel://u:pw@127.0.0.1:26379,127.0.0.1:26380,sentinel-3/distlock/2\
         ?key_prefix=app&connect_timeout=250ms&default_ttl_ms=1500&sentinel_password=s3\
         &protocol=resp3",
    )
    .unwrap();
    assert!(c.is_sentinel());
    assert!(!c.is_cluster());
    assert_eq!(
        c.endpoint(),
        "sentinel 127.0.0.1:26379,127.0.0.1:26380,sentinel-3:26379/distlock"
    );
    let spec = c.sentinel.as_ref().unwrap();
    assert_eq!(spec.master, "distlock");
    assert_eq!(spec.sentinels.len(), 3);
    // The sentinels get the sentinel password, never the data nodes' credentials.
    let info = spec.sentinels[0].client.get_connection_info();
    assert_eq!(info.redis_settings().password(), Some("s3"));
    assert_eq!(info.redis_settings().username(), None);
    // A data node gets the URL's user, password, database and protocol.
    let node = spec.node.at("10.0.0.9", 6390).unwrap();
    assert_eq!(node.display, "10.0.0.9:6390/2");
    let info = node.client.get_connection_info();
    assert_eq!(info.addr().to_string(), "10.0.0.9:6390");
    assert_eq!(info.redis_settings().username(), Some("u"));
    assert_eq!(info.redis_settings().password(), Some("pw"));
    assert_eq!(info.redis_settings().db(), 2);
    assert_eq!(
        info.redis_settings().protocol(),
        redis::ProtocolVersion::RESP3
    );
    let v6 = spec.node.at("::1", 6390).unwrap();
    assert_eq!(v6.display, "[::1]:6390/2");
    // The shared options keep working.
    assert_eq!(c.options.key_prefix, "app");
    assert_eq!(c.get_connect_timeout(), Duration::from_millis(250));
    assert_eq!(c.get_default_ttl(), Duration::from_millis(1500));
    for secret in ["pw", "s3"] {
        assert!(!format!("{c:?}").contains(secret), "{c:?}");
    }
    let plain = RedisConfig::from_url("redis+sentinel://h/m").unwrap();
    assert_eq!(plain.endpoint(), "sentinel h:26379/m");
    let spec = plain.sentinel.as_ref().unwrap();
    assert_eq!(spec.node.at("h", 1).unwrap().display, "h:1");
    assert_eq!(
        spec.sentinels[0]
            .client
            .get_connection_info()
            .redis_settings()
            .password(),
        None
    );
    assert!(RedisConfig::from_url("REDIS+SENTINEL://h:1/m/").is_ok());
    assert!(!RedisConfig::from_url("redis://h:1").unwrap().is_sentinel());
}

#[test]
fn bad_sentinel_urls_are_invalid_argument_before_any_io() {
    for bad in [
        "redis+sentinel://",
        "redis+sentinel:///distlock",
        "redis+sentinel://h:1",
        "redis+sentinel://h:1/",
        "redis+sentinel://h:1,,h:2/m",
        "redis+sentinel://h:x/m",
        "redis+sentinel://h:0/m",
        "redis+sentinel://h:70000/m",
        "redis+sentinel://h:1/m/notadb",
        "redis+sentinel://h:1/m/0/extra",
        "redis+sentinel://h:1/m?bogus=1",
        "redis+sentinel://h:1/m?map_seeds=true",
        "redis+sentinel://h:1/m?default_ttl=10",
        "redis+sentinel://h:1/m?protocol=resp9",
        "redis+sentinel://h:1/m?key_prefix=a%7Bb",
        "redis+sentinel://h:1/m?release_signals=false",
        "redis+sentinel://h:1/m#frag",
    ] {
        let e = RedisConfig::from_url(bad).expect_err(bad);
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}: {e}");
    }
    let tls = RedisConfig::from_url("rediss+sentinel://h:1/m");
    if cfg!(feature = "tls") {
        assert!(tls.unwrap().is_sentinel());
    } else {
        assert_eq!(tls.unwrap_err().kind(), ErrorKind::Unsupported);
    }
}

#[test]
fn the_descriptor_answers_the_sentinel_schemes() {
    for scheme in ["redis+sentinel", "rediss+sentinel"] {
        assert!(crate::DESCRIPTOR.schemes.contains(&scheme), "{scheme}");
    }
}
