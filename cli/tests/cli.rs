//! The `distlock` command against the real Redis server the test command starts: mutual
//! exclusion between `distlock run` processes, the exit-code table, a command whose lock is
//! lost being stopped, signal forwarding, `holder --json`, `list` and `release --force`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use distlock_redis::testing::redis_admin;
use distlock_redis::LockName;

fn skipped() -> bool {
    let skip = distlock_conformance::skipped_by_env("redis");
    if skip {
        eprintln!("SKIPPING: DISTLOCK_SKIP names redis");
    }
    skip
}

fn url() -> String {
    distlock_redis::DESCRIPTOR.test_url()
}

/// A lock name and a scratch directory of this test's own.
fn scratch(tag: &str) -> (String, PathBuf) {
    let id = format!(
        "cli-{tag}-{}-{:08x}",
        std::process::id(),
        distlock_conformance::unique_suffix()
    );
    let dir = std::env::temp_dir().join(&id);
    std::fs::create_dir_all(&dir).unwrap();
    (id, dir)
}

fn distlock(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_distlock"));
    cmd.env("DISTLOCK_URL", url()).args(args);
    cmd
}

fn output(args: &[&str]) -> Output {
    distlock(args).output().expect("run distlock")
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("distlock exits, not killed")
}

/// Waits until `path` exists and contains `text`.
fn wait_for(path: &Path, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if std::fs::read_to_string(path).is_ok_and(|s| s.contains(text)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} never said {text:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `distlock run` holding `name` whose command writes `ready` (and its token) to `dir/ready`,
/// then sleeps; on SIGTERM it writes `term` to `dir/term` and exits 0.
fn holding(name: &str, dir: &Path, extra: &[&str]) -> Child {
    let mut args = vec!["run", "--name", name];
    args.extend_from_slice(extra);
    ready(args, dir)
}

/// `distlock` with `args` and the command [`holding`] describes, once its command is ready.
fn ready(args: Vec<&str>, dir: &Path) -> Child {
    let script = format!(
        "trap 'echo term > {d}/term; exit 0' TERM; echo \"ready $DISTLOCK_TOKEN $DISTLOCK_NAME\" > {d}/ready; \
         while true; do sleep 0.05; done",
        d = dir.display()
    );
    let all: Vec<&str> = args
        .into_iter()
        .chain(["--", "sh", "-c", script.as_str()])
        .collect();
    let child = distlock(&all)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn distlock");
    wait_for(&dir.join("ready"), "ready");
    child
}

/// Deletes `name`'s lock on the server, as an operator or a bug would.
fn delete_behind_its_back(name: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let admin = redis_admin(url()).await.unwrap();
        admin
            .remove_holder(&LockName::new(name).unwrap())
            .await
            .unwrap();
    });
}

fn stop(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

#[test]
fn runs_on_one_name_never_interleave() {
    if skipped() {
        return;
    }
    let (name, dir) = scratch("excl");
    let log = dir.join("log");
    let script = format!(
        "echo \"start $DISTLOCK_TOKEN\" >> {l}; sleep 0.2; echo \"end $DISTLOCK_TOKEN\" >> {l}",
        l = log.display()
    );
    let runs: Vec<Child> = (0..4)
        .map(|_| {
            distlock(&[
                "run", "--name", &name, "--wait", "30s", "--", "sh", "-c", &script,
            ])
            .spawn()
            .unwrap()
        })
        .collect();
    for mut r in runs {
        assert_eq!(r.wait().unwrap().code(), Some(0));
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 8, "four runs, a start and an end each: {text}");
    let mut last_token = 0u64;
    for pair in lines.chunks(2) {
        let start: Vec<&str> = pair[0].split(' ').collect();
        let end: Vec<&str> = pair[1].split(' ').collect();
        assert_eq!(start[0], "start", "interleaved: {text}");
        assert_eq!(end[0], "end", "interleaved: {text}");
        assert_eq!(start[1], end[1], "one run's start and end: {text}");
        let token: u64 = start[1].parse().unwrap();
        assert!(token > last_token, "fencing tokens rise: {text}");
        last_token = token;
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn exit_codes_follow_the_table() {
    if skipped() {
        return;
    }
    let (name, dir) = scratch("codes");
    // The command's own status, and 128+N when signal N killed it.
    let out = output(&["run", "--name", &name, "--", "sh", "-c", "exit 7"]);
    assert_eq!(code(&out), 7);
    let out = output(&["run", "--name", &name, "--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(code(&out), 128 + 9);
    // Not found, and found but not executable.
    let out = output(&[
        "run",
        "--name",
        &name,
        "--",
        "/nonexistent/distlock-test-command",
    ]);
    assert_eq!(code(&out), 127);
    let plain = dir.join("not-executable");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    let out = output(&["run", "--name", &name, "--", plain.to_str().unwrap()]);
    assert_eq!(code(&out), 126);
    // The lock was not given back after those: a try-once run gets it at once.
    let out = output(&["run", "--name", &name, "--no-wait", "--", "true"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));

    // Held by someone else: 124 at once with --no-wait, and after --wait runs out.
    let holder = holding(&name, &dir, &[]);
    let started = Instant::now();
    let out = output(&["run", "--name", &name, "--no-wait", "--", "true"]);
    assert_eq!(code(&out), 124, "{}", String::from_utf8_lossy(&out.stderr));
    let out = output(&["run", "--name", &name, "--wait", "300ms", "--", "true"]);
    assert_eq!(code(&out), 124, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(started.elapsed() >= Duration::from_millis(300));
    stop(holder);

    // Unavailable server: 69. Bad arguments: 64, before any I/O.
    let out = distlock(&["run", "--name", &name, "--", "true"])
        .env("DISTLOCK_URL", "redis://127.0.0.1:1/?connect_timeout=500ms")
        .output()
        .unwrap();
    assert_eq!(code(&out), 69, "{}", String::from_utf8_lossy(&out.stderr));
    for bad in [
        vec!["run", "--name", &name, "--wait", "soon", "--", "true"],
        vec!["run", "--name", "", "--", "true"],
        vec!["run", "--name", &name],
        vec!["frobnicate"],
        // No semaphore of 0 permits.
        vec!["run", "--name", &name, "--permits", "0", "--", "true"],
    ] {
        let out = output(&bad);
        assert_eq!(
            code(&out),
            64,
            "{bad:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A permit, where the backend has semaphores: Redis, and the in-memory one.
    let out = output(&["run", "--name", &name, "--permits", "2", "--", "true"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let out = distlock(&["run", "--name", &name, "--permits", "3", "--", "true"])
        .env("DISTLOCK_URL", "memory://")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let out = distlock(&["holder", &name])
        .env("DISTLOCK_URL", "gopher://x")
        .output()
        .unwrap();
    assert_eq!(code(&out), 64);
    let out = distlock(&["holder", &name])
        .env_remove("DISTLOCK_URL")
        .output()
        .unwrap();
    assert_eq!(code(&out), 64, "no URL at all");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_lost_lock_stops_the_command() {
    if skipped() {
        return;
    }
    let (name, dir) = scratch("lost");
    let holder = holding(&name, &dir, &["--ttl", "1500ms", "--grace", "5s"]);
    delete_behind_its_back(&name);
    // The next renewal (every third of the lease) finds the lock gone.
    let out = holder.wait_with_output().unwrap();
    assert_eq!(code(&out), 123, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("lost"),
        "says why: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(&dir.join("term"), "term");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_command_that_ignores_sigterm_is_killed_after_the_grace() {
    if skipped() {
        return;
    }
    let (name, dir) = scratch("grace");
    let script = format!(
        "trap '' TERM; echo ready > {d}/ready; while true; do sleep 0.05; done",
        d = dir.display()
    );
    let child = distlock(&[
        "run", "--name", &name, "--ttl", "1500ms", "--grace", "300ms", "--", "sh", "-c", &script,
    ])
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    wait_for(&dir.join("ready"), "ready");
    delete_behind_its_back(&name);
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 123, "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn signals_are_forwarded_to_the_command() {
    if skipped() {
        return;
    }
    let (name, dir) = scratch("signals");
    let script = format!(
        "trap 'echo usr1 >> {d}/got; exit 3' USR1; echo ready > {d}/ready; \
         while true; do sleep 0.05; done",
        d = dir.display()
    );
    let child = distlock(&["run", "--name", &name, "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    wait_for(&dir.join("ready"), "ready");
    Command::new("kill")
        .args(["-USR1", &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 3, "the command's own status after the signal");
    wait_for(&dir.join("got"), "usr1");
    // Released when the command ended.
    let out = output(&["holder", &name]);
    assert_eq!(code(&out), 1, "{}", String::from_utf8_lossy(&out.stdout));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn holder_json_names_the_running_holder() {
    if skipped() {
        return;
    }
    let (name, dir) = scratch("holder");
    let holder = holding(&name, &dir, &["--ttl", "10s"]);
    let ready = std::fs::read_to_string(dir.join("ready")).unwrap();
    let mut fields = ready.split_whitespace().skip(1);
    let token: u64 = fields.next().unwrap().parse().unwrap();
    assert_eq!(fields.next(), Some(name.as_str()), "DISTLOCK_NAME");

    let out = output(&["--json", "holder", &name]);
    assert_eq!(code(&out), 0);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("holder --json is JSON");
    assert_eq!(v["name"], name.as_str());
    assert_eq!(v["held"], true);
    assert_eq!(v["token"], token, "the token the command got");
    assert_eq!(v["hold_count"], 1);
    let owner = v["owner"].as_str().unwrap();
    assert!(
        owner.contains(&format!(":{}:", holder.id())),
        "the owner names the holding process: {owner}"
    );
    let left = v["remaining_ms"].as_u64().unwrap();
    assert!(left > 0 && left <= 10_000, "lease left {left} ms");
    // When the grant began, by the server's clock (this machine's: the server is on loopback).
    let since = v["since_unix_ms"]
        .as_u64()
        .expect("Redis keeps the grant's time");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(
        since <= now + 2_000 && since + 60_000 >= now,
        "since {since} ms, now {now} ms"
    );
    let text = v["since"].as_str().expect("since as RFC 3339");
    assert!(text.ends_with('Z') && text.len() == 24, "{text}");

    let out = output(&["holder", &name]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(owner) && text.contains(&format!("fencing token {token}")),
        "{text}"
    );
    stop(holder);

    let out = output(&["--json", "holder", &name]);
    assert_eq!(code(&out), 1);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["held"], false);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn list_shows_the_holders_and_release_force_frees_only_the_token_shown() {
    if skipped() {
        return;
    }
    let (base, dir) = scratch("list");
    let (a, b) = (format!("{base}/a"), format!("{base}/b"));
    let (dir_a, dir_b) = (dir.join("a"), dir.join("b"));
    std::fs::create_dir_all(&dir_a).unwrap();
    std::fs::create_dir_all(&dir_b).unwrap();
    let holder_a = holding(&a, &dir_a, &["--ttl", "2s"]);
    let holder_b = holding(&b, &dir_b, &["--ttl", "10s"]);
    let token_of = |d: &Path| -> u64 {
        let ready = std::fs::read_to_string(d.join("ready")).unwrap();
        ready.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let (token_a, token_b) = (token_of(&dir_a), token_of(&dir_b));

    let prefix = format!("{base}/");
    let out = output(&["--json", "list", &prefix]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("list --json is JSON");
    let listed: Vec<(&str, u64)> = v
        .as_array()
        .expect("an array")
        .iter()
        .map(|l| (l["name"].as_str().unwrap(), l["token"].as_u64().unwrap()))
        .collect();
    assert_eq!(listed, [(a.as_str(), token_a), (b.as_str(), token_b)]);
    let text = String::from_utf8_lossy(&output(&["list", &prefix]).stdout).into_owned();
    assert!(text.contains(&a) && text.contains(&b), "{text}");

    // Not forced: refused before any I/O. Another token: nothing released.
    assert_eq!(code(&output(&["release", &a])), 64);
    let wrong = (token_a + 1).to_string();
    let out = output(&["release", "--force", "--token", &wrong, &a]);
    assert_eq!(code(&out), 1, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(code(&output(&["holder", &a])), 0, "still held");

    // Forced with the token shown: released, and the holder's command is stopped as for any
    // lost lock.
    let out = output(&["--json", "release", "--force", &a]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["released"].as_bool(), v["token"].as_u64()),
        (Some(true), Some(token_a))
    );
    wait_for(&dir_a.join("term"), "term");
    let status = wait_exit(holder_a);
    assert_eq!(status, 123, "distlock run exits 123 when its lock is lost");

    let out = output(&["--json", "list", &prefix]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, [b.as_str()]);
    stop(holder_b);
    let out = output(&["--json", "list", &prefix]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
    let out = output(&["release", "--force", &b]);
    assert_eq!(code(&out), 1, "a free lock: nothing released");
    let _ = std::fs::remove_dir_all(dir);
}

/// Waits (bounded) for `child` to exit by itself and returns its exit code.
fn wait_exit(mut child: Child) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().expect("exited, not killed");
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("distlock run did not exit after its lock was lost");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn elect_runs_the_command_while_leading_and_leader_shows_its_value() {
    if skipped() {
        return;
    }
    let (name, dir) = scratch("elect");
    let leading = ready(
        vec!["elect", "--name", &name, "--value", "10.0.0.7:80"],
        &dir,
    );
    let said = std::fs::read_to_string(dir.join("ready")).unwrap();
    let epoch: u64 = said.split_whitespace().nth(1).unwrap().parse().unwrap();

    let out = output(&["--json", "leader", &name]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("leader --json is JSON");
    assert_eq!(
        (&v["led"], &v["epoch"], &v["value"]),
        (&true.into(), &epoch.into(), &"10.0.0.7:80".into()),
        "{v}"
    );
    let owner = v["owner"].as_str().unwrap();
    assert!(owner.contains(&format!(":{}:", leading.id())), "{owner}");
    let out = output(&["leader", &name]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("epoch {epoch}, value \"10.0.0.7:80\"")),
        "{text}"
    );

    // Someone leads: a second campaigner that does not wait gives up with 124 and runs nothing.
    let out = output(&[
        "elect",
        "--no-wait",
        "--name",
        &name,
        "--value",
        "b",
        "--",
        "false",
    ]);
    assert_eq!(code(&out), 124);
    // Bad input before any I/O.
    let out = output(&[
        "elect",
        "--name",
        &name,
        "--value",
        "b",
        "--permits",
        "2",
        "--",
        "true",
    ]);
    assert_eq!(code(&out), 64);
    let long = "v".repeat(distlock::MAX_VALUE_LEN + 1);
    let out = output(&["elect", "--name", &name, "--value", &long, "--", "true"]);
    assert_eq!(code(&out), 64);

    // A watcher sees the leader, then the vacancy when it stops, then the next leader.
    let mut watch = distlock(&["--json", "leader", &name, "--watch"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn distlock leader --watch");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(watch.stdout.take().unwrap()));
    let mut next = || -> serde_json::Value {
        serde_json::from_str(&lines.next().expect("a line").expect("read")).expect("JSON")
    };
    assert_eq!(next()["epoch"], epoch);
    stop(leading);
    assert_eq!(next()["led"], false, "a vacancy after the leader stopped");
    let (_, dir2) = scratch("elect-next");
    let next_leader = ready(vec!["elect", "--name", &name, "--value", "next"], &dir2);
    let v = next();
    assert_eq!(
        (&v["led"], &v["value"]),
        (&true.into(), &"next".into()),
        "{v}"
    );
    assert!(v["epoch"].as_u64().unwrap() > epoch, "{v}");
    stop(next_leader);
    stop(watch);
    let out = output(&["leader", &name]);
    assert_eq!(code(&out), 1, "nobody leads after the command exited");
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(dir2);
}
