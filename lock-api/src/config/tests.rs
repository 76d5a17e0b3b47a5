use super::*;

const DEFAULTS: ClientOptions = ClientOptions::new(
    Duration::from_secs(30),
    Duration::from_secs(5),
    Duration::from_secs(5),
);

fn options(url: &str) -> Result<ClientOptions> {
    let url = ConfigUrl::parse("test", url)?;
    let mut query = url.options()?;
    let mut options = DEFAULTS.clone();
    options.take_from(&mut query)?;
    query.finish(&[])?;
    options.validate("test")?;
    Ok(options)
}

#[test]
fn durations_need_a_unit() {
    assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
    assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
    assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
    for bad in [
        "",
        "10",
        "s",
        "1.5s",
        "-1s",
        "10h",
        "10 s",
        "10S",
        "99999999999999999999s",
    ] {
        assert_eq!(parse_duration(bad), None, "{bad:?}");
    }
    assert_eq!(parse_duration(&format!("{}m", u64::MAX)), None);
}

#[test]
fn each_shared_option_parses_in_both_spellings() {
    let o = options("x://h?owner=w-1&default_ttl=1500ms&connect_timeout=2s&operation_timeout=1m")
        .unwrap();
    assert_eq!(o.owner.as_ref().map(OwnerId::label), Some("w-1"));
    assert_eq!(o.default_ttl, Duration::from_millis(1500));
    assert_eq!(o.connect_timeout, Duration::from_secs(2));
    assert_eq!(o.operation_timeout, Duration::from_secs(60));
    let o =
        options("x://h?default_ttl_ms=900&connect_timeout_ms=250&response_timeout_ms=7").unwrap();
    assert_eq!(o.default_ttl, Duration::from_millis(900));
    assert_eq!(o.connect_timeout, Duration::from_millis(250));
    assert_eq!(o.operation_timeout, Duration::from_millis(7));
    let o = options("x://h?request_timeout=3s").unwrap();
    assert_eq!(o.operation_timeout, Duration::from_secs(3));
    assert_eq!(options("x://h").unwrap(), DEFAULTS);
}

#[test]
fn bad_values_name_the_option() {
    for (url, option) in [
        ("x://h?owner=a%20b", "owner"),
        ("x://h?owner=", "owner"),
        ("x://h?default_ttl=10", "default_ttl"),
        ("x://h?default_ttl=0s", "default TTL"),
        ("x://h?default_ttl=8000000s", "default TTL"),
        ("x://h?default_ttl_ms=soon", "default_ttl_ms"),
        ("x://h?default_ttl_ms=5s", "default_ttl_ms"),
        ("x://h?connect_timeout=0ms", "connect timeout"),
        ("x://h?connect_timeout=11m", "connect timeout"),
        ("x://h?connect_timeout_ms=-5", "connect_timeout_ms"),
        ("x://h?operation_timeout=5000", "operation_timeout"),
        ("x://h?operation_timeout_ms=600001", "operation timeout"),
        ("x://h?request_timeout=1h", "request_timeout"),
        ("x://h?operation_timeout", "operation_timeout"),
        ("x://h?bogus=1", "bogus"),
        ("x://h?default_ttl=%zz", "default_ttl"),
    ] {
        let e = options(url).expect_err(url);
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{url}: {e}");
        assert_eq!(e.backend(), Some("test"), "{url}: {e}");
        assert!(e.message().contains(option), "{url}: {e}");
    }
}

#[test]
fn passwords_are_redacted_everywhere() {
    assert_eq!(redact("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
    assert_eq!(
        redact("etcd://u%40x:p%3Ass@h1,h2/p"),
        "etcd://u%40x:***@h1,h2/p"
    );
    assert_eq!(redact("mongodb://u:p@ss@h/?a=b"), "mongodb://u:***@h/?a=b");
    assert_eq!(redact("redis://h:1?owner=a"), "redis://h:1?owner=a");
    assert_eq!(redact("redis://user@h"), "redis://user@h");
    assert_eq!(redact("u:pw@h"), "u:***@h");
    for url in [
        "x://me:secret@h?default_ttl=soon",
        "x://me:secret@h?nope=1",
        "x://me:secret@h#frag",
        "x://me:secret@h?owner=a%20b",
    ] {
        let e = options(url).expect_err(url);
        assert!(!e.to_string().contains("secret"), "{e}");
        assert!(e.to_string().contains("me:***@h"), "{e}");
    }
}

#[test]
fn urls_are_cut_into_their_parts() {
    let u = ConfigUrl::parse("t", "etcd://u%40x:p%3Ass@h1:1,h2,[::1]:3/a%2Fb/c?k=v&x=y").unwrap();
    assert_eq!(u.scheme, "etcd");
    assert_eq!(u.decode(u.user.unwrap(), "user").unwrap(), "u@x");
    assert_eq!(u.decode(u.password.unwrap(), "password").unwrap(), "p:ss");
    assert_eq!(u.path, Some("/a%2Fb/c"));
    let hosts = u.hosts(2379).unwrap();
    let shown: Vec<String> = hosts.iter().map(ToString::to_string).collect();
    assert_eq!(shown, ["h1:1", "h2:2379", "[::1]:3"]);
    assert_eq!(hosts[2].host, "::1");
    let mut q = u.options().unwrap();
    assert_eq!(q.take_str("k").as_deref(), Some("v"));
    assert_eq!(q.rest().as_deref(), Some("x=y"));
    let u = ConfigUrl::parse("t", "zk://h").unwrap();
    assert_eq!((u.user, u.path, u.query), (None, None, None));
    assert_eq!(u.options().unwrap().rest(), None);
}

#[test]
fn bad_hosts_and_escapes_are_invalid_argument() {
    for bad in [
        "",
        "h",
        "://h",
        "x://h#f",
        "x://",
        "x://h:0",
        "x://h:65536",
        "x://h:port",
        "x://h,,g",
        "x://h one",
        "x://[::1",
        "x://[zz]:1",
        "x://[::1]x",
        "x://h:1:2",
    ] {
        let r = ConfigUrl::parse("t", bad).and_then(|u| u.hosts(1));
        let e = r.expect_err(bad);
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}: {e}");
    }
    assert_eq!(percent_decode("a%2Fb%C3%A9").as_deref(), Some("a/bé"));
    for bad in ["%", "a%2", "%zz", "%FF", "%C3"] {
        assert_eq!(percent_decode(bad), None, "{bad}");
    }
}
