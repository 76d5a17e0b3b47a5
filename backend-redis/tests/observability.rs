//! The spans, events and metrics `docs/observability.md` lists, from a networked backend against
//! a real server: an acquire span with its outcome and token, renewals, a lost lock with its
//! reason, and the background settling of a lost answer (a private redis-server paused
//! mid-request).

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::private::PrivateRedis;
use distlock_redis::redis::AsyncCommands;
use distlock_redis::{ErrorKind, LockExt, LockOptions, RedisConfig, RedisLock};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

fn skipped() -> bool {
    let skip = distlock_conformance::skipped_by_env("redis");
    if skip {
        eprintln!("SKIPPING: DISTLOCK_SKIP names redis");
    }
    skip
}

/// Field name → value, as text.
type Fields = HashMap<String, String>;

/// Every span (name and final fields) and event (message and fields) seen.
#[derive(Clone, Default)]
struct Seen {
    spans: Arc<Mutex<HashMap<u64, (String, Fields)>>>,
    events: Arc<Mutex<Vec<Fields>>>,
}

struct Collect(Fields);

impl Visit for Collect {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_string(),
            format!("{value:?}").trim_matches('"').to_string(),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Seen {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut c = Collect(Fields::new());
        attrs.record(&mut c);
        let name = attrs.metadata().name().to_string();
        self.spans
            .lock()
            .unwrap()
            .insert(id.into_u64(), (name, c.0));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some((_, fields)) = self.spans.lock().unwrap().get_mut(&id.into_u64()) {
            let mut c = Collect(std::mem::take(fields));
            values.record(&mut c);
            *fields = c.0;
        }
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut c = Collect(Fields::new());
        event.record(&mut c);
        c.0.insert("level".into(), event.metadata().level().to_string());
        self.events.lock().unwrap().push(c.0);
    }
}

impl Seen {
    fn spans_named(&self, name: &str) -> Vec<Fields> {
        self.spans
            .lock()
            .unwrap()
            .values()
            .filter(|(n, _)| n == name)
            .map(|(_, f)| f.clone())
            .collect()
    }

    fn event(&self, message: &str, lock: &str) -> Option<Fields> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .find(|e| {
                e.get("message").map(String::as_str) == Some(message)
                    && e.get("lock").map(String::as_str) == Some(lock)
            })
            .cloned()
    }
}

/// Counter totals. A debugging recorder's snapshot hands out each counter's increments since
/// the last snapshot, so they are added up here.
#[derive(Default)]
struct Totals(Mutex<HashMap<MetricId, u64>>);

/// A metric's name and labels.
type MetricId = (String, Vec<(String, String)>);

impl Totals {
    fn counter(&self, recorder: &DebuggingRecorder, name: &str, labels: &[(&str, &str)]) -> u64 {
        let mut totals = self.0.lock().unwrap();
        for (key, _, _, value) in recorder.snapshotter().snapshot().into_vec() {
            if let DebugValue::Counter(n) = value {
                let labels = key
                    .key()
                    .labels()
                    .map(|l| (l.key().to_string(), l.value().to_string()))
                    .collect();
                *totals
                    .entry((key.key().name().to_string(), labels))
                    .or_default() += n;
            }
        }
        totals
            .iter()
            .filter(|((n, ls), _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| ls.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, n)| n)
            .sum()
    }
}

async fn client(url: &str) -> Arc<RedisLock> {
    let config = RedisConfig::from_url(url)
        .unwrap()
        .response_timeout(Duration::from_millis(300));
    Arc::new(RedisLock::connect(config).await.unwrap())
}

#[test]
fn acquires_renewals_losses_and_settling_are_traced_and_counted() {
    if skipped() {
        return;
    }
    let seen = Seen::default();
    let _trace =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(seen.clone()));
    let recorder = DebuggingRecorder::new();
    let totals = Totals::default();
    let counter = |name: &str, labels: &[(&str, &str)]| totals.counter(&recorder, name, labels);
    let _metrics = metrics::set_default_local_recorder(&recorder);
    // One thread: the watchdog and the background work report to this thread's subscriber and
    // recorder.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let url = common::redis_url();
        let c = client(&url).await;
        let name = format!("{}observe", common::unique("obs"));

        // An acquire span with its outcome and token; renewals of a 300 ms watchdog lease.
        let g = c
            .lock_with(
                &name,
                &LockOptions::new().watchdog_ttl(Duration::from_millis(300)),
            )
            .await
            .unwrap();
        let span = seen
            .spans_named("distlock.acquire")
            .into_iter()
            .find(|s| s.get("lock") == Some(&name))
            .expect("no distlock.acquire span for the lock");
        assert_eq!(span.get("backend").map(String::as_str), Some("redis"));
        assert_eq!(span.get("mode").map(String::as_str), Some("wait"));
        assert_eq!(span.get("outcome").map(String::as_str), Some("granted"));
        assert_eq!(span.get("token"), Some(&g.token().0.to_string()));
        tokio::time::sleep(Duration::from_millis(400)).await;
        let renewed = seen.event("renewed", &name).expect("no renewed event");
        assert_eq!(renewed.get("backend").map(String::as_str), Some("redis"));
        let renew = seen
            .spans_named("distlock.renew")
            .into_iter()
            .find(|s| s.get("lock") == Some(&name))
            .expect("no distlock.renew span for the lock");
        assert_eq!(renew.get("backend").map(String::as_str), Some("redis"));
        assert_eq!(renew.get("token"), Some(&g.token().0.to_string()));
        assert_eq!(renew.get("grants").map(String::as_str), Some("1"));
        assert_eq!(renew.get("outcome").map(String::as_str), Some("renewed"));
        assert!(
            counter(
                "distlock_renewals_total",
                &[("backend", "redis"), ("outcome", "renewed")]
            ) >= 1
        );

        // The key deleted behind the holder's back: the next renewal finds it gone.
        let mut raw = common::raw(&url).await.unwrap();
        let _: () = raw.del(format!("distlock:{{{name}}}:lock")).await.unwrap();
        let reason = tokio::time::timeout(Duration::from_secs(5), g.lost())
            .await
            .unwrap();
        let lost = seen.event("lock lost", &name).expect("no lock lost event");
        assert_eq!(
            lost.get("reason").map(String::as_str),
            Some("taken"),
            "{reason}"
        );
        assert_eq!(lost.get("level").map(String::as_str), Some("WARN"));
        assert_eq!(
            counter(
                "distlock_locks_lost_total",
                &[("backend", "redis"), ("reason", "taken")]
            ),
            1
        );
        let token = g.token().0.to_string();
        assert!(!g.release().await.unwrap());
        assert_eq!(
            counter(
                "distlock_releases_total",
                &[("backend", "redis"), ("outcome", "not_held")]
            ),
            1
        );
        let release = seen
            .spans_named("distlock.release")
            .into_iter()
            .find(|s| s.get("lock") == Some(&name))
            .expect("no distlock.release span for the lock");
        assert_eq!(release.get("token"), Some(&token));
        assert_eq!(release.get("outcome").map(String::as_str), Some("not_held"));
        let lost_renewals = seen
            .spans_named("distlock.renew")
            .into_iter()
            .filter(|s| s.get("lock") == Some(&name))
            .filter(|s| s.get("outcome").map(String::as_str) == Some("lost"))
            .count();
        assert_eq!(lost_renewals, 1, "the renewal that found the lock gone");

        // A lost answer: the acquire reaches a paused server, which applies it on resuming.
        let server = PrivateRedis::start_free();
        let p = client(&server.url()).await;
        assert!(p.holder("paused").await.unwrap().is_none());
        server.signal("STOP");
        let e = p
            .try_lock_with("paused", &LockOptions::new().ttl(Duration::from_secs(600)))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        server.signal("CONT");
        let settling = seen.event("answer lost: settling in the background", "paused");
        assert_eq!(
            settling.and_then(|e| e.get("job").cloned()).as_deref(),
            Some("give_back")
        );
        let mut given_back = 0;
        for _ in 0..100 {
            given_back = counter(
                "distlock_settled_total",
                &[("job", "give_back"), ("outcome", "given_back")],
            );
            if given_back == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(given_back, 1, "the give-back was not counted");
        assert!(p.holder("paused").await.unwrap().is_none());
        assert_eq!(
            counter(
                "distlock_acquires_total",
                &[("backend", "redis"), ("outcome", "error")]
            ),
            1
        );
    });
}
