//! What distlock tells operators, written once for every backend: `tracing` spans and events,
//! and, with the `metrics` feature, counters, histograms and a gauge through the `metrics`
//! facade. `docs/observability.md` lists every name and label.
//!
//! Nothing is logged at `info` or above on a lock cycle that goes well: spans and events of
//! acquires, releases and renewals are at `debug`; a renewal that failed, a lock lost and work
//! the client does in the background after a lost answer are at `warn`/`info`. The in-memory
//! backend's uncontended cycle records metrics only (it does no I/O to trace).

use tracing::{debug, field, info, warn, Span};

use crate::error::LostReason;
use crate::error::{ErrorKind, Result};

/// When an acquire began, for the latency histograms: an `Instant` with the `metrics` feature,
/// nothing (and no clock read) without.
#[derive(Clone, Copy)]
pub(crate) struct Stamp(#[cfg(feature = "metrics")] std::time::Instant);

/// Now, as a [`Stamp`].
#[cfg(feature = "metrics")]
#[inline(always)]
pub(crate) fn stamp() -> Stamp {
    Stamp(std::time::Instant::now())
}

/// Now, as a [`Stamp`].
#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(crate) fn stamp() -> Stamp {
    Stamp()
}

/// A span for one acquire call on `backend`: `try` (no wait) or `wait`.
pub(crate) fn acquire_span(backend: &'static str, name: &str, waits: bool) -> Span {
    tracing::debug_span!(
        "distlock.acquire",
        backend,
        lock = name,
        mode = if waits { "wait" } else { "try" },
        token = field::Empty,
        outcome = field::Empty,
    )
}

/// A span for one release of a guard's grant: the request, and the retries of one the server
/// did not answer.
pub(crate) fn release_span(backend: &'static str, name: &str, token: u64) -> Span {
    tracing::debug_span!(
        "distlock.release",
        backend,
        lock = name,
        token,
        outcome = field::Empty,
    )
}

/// A span for one renewal request of the watchdog: one grant (its lock and token), or a batch of
/// `grants` that the backend confirms at once (`lock` and `token` then stay empty).
pub(crate) fn renew_span(backend: &'static str, one: Option<(&str, u64)>, grants: usize) -> Span {
    let span = tracing::debug_span!(
        "distlock.renew",
        backend,
        grants,
        lock = field::Empty,
        token = field::Empty,
        outcome = field::Empty,
    );
    if let Some((name, token)) = one {
        span.record("lock", name);
        span.record("token", token);
    }
    span
}

/// How an acquire call ended.
#[derive(Clone, Copy)]
pub(crate) enum Acquired {
    Granted(u64),
    Held,
    Failed(ErrorKind),
}

impl Acquired {
    pub(crate) fn of<T>(result: &Result<T>, token: impl FnOnce(&T) -> Option<u64>) -> Self {
        match result {
            Ok(v) => token(v).map_or(Acquired::Held, Acquired::Granted),
            Err(e) => Acquired::Failed(e.kind()),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Acquired::Granted(_) => "granted",
            Acquired::Held => "held",
            Acquired::Failed(ErrorKind::Timeout) => "timeout",
            Acquired::Failed(_) => "error",
        }
    }
}

/// Records an acquire call's outcome on its span, as an event and in the metrics.
pub(crate) fn acquired(
    span: &Span,
    backend: &'static str,
    waits: bool,
    outcome: Acquired,
    started: Stamp,
) {
    let outcome_label = outcome.label();
    span.record("outcome", outcome_label);
    if let Acquired::Granted(token) = outcome {
        span.record("token", token);
    }
    span.in_scope(|| debug!(outcome = outcome_label, "acquire ended"));
    acquire_metrics(backend, waits, outcome_label, started);
}

/// The metrics of one acquire call.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
#[inline]
pub(crate) fn acquire_metrics(
    backend: &'static str,
    waits: bool,
    outcome: &'static str,
    started: Stamp,
) {
    #[cfg(feature = "metrics")]
    {
        let seconds = started.0.elapsed().as_secs_f64();
        let histogram = if waits {
            "distlock_wait_seconds"
        } else {
            "distlock_acquire_seconds"
        };
        metrics::histogram!(histogram, "backend" => backend, "outcome" => outcome).record(seconds);
        metrics::counter!("distlock_acquires_total", "backend" => backend, "outcome" => outcome)
            .increment(1);
        if outcome == "granted" {
            metrics::gauge!("distlock_guards_held", "backend" => backend).increment(1.0);
        }
    }
}

/// Records a release's outcome.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn released(
    backend: &'static str,
    name: &str,
    token: u64,
    result: Option<&Result<bool>>,
) {
    let outcome = match result {
        Some(Ok(true)) => "released",
        Some(Ok(false)) => "not_held",
        Some(Err(_)) => "error",
        // Dropped: the release runs in the background.
        None => "dropped",
    };
    Span::current().record("outcome", outcome);
    match result {
        Some(Err(e)) => debug!(backend, lock = name, token, error = %e, "release failed"),
        _ => debug!(backend, lock = name, token, outcome, "released"),
    }
    released_metrics(backend, outcome);
}

/// The metrics of one release.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
#[inline]
pub(crate) fn released_metrics(backend: &'static str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!("distlock_releases_total", "backend" => backend, "outcome" => outcome)
            .increment(1);
        metrics::gauge!("distlock_guards_held", "backend" => backend).decrement(1.0);
    }
}

/// The outcome a renewal request's span records: `renewed` if every grant in it was, else
/// `lost` if one was found gone, else `failed`.
pub(crate) fn renewal_outcome(results: &[Result<std::time::Duration>]) -> &'static str {
    let lost = |e: &crate::Error| matches!(e.kind(), ErrorKind::Lost | ErrorKind::NotHeld);
    if results.iter().all(|r| r.is_ok()) {
        "renewed"
    } else if results.iter().any(|r| r.as_ref().is_err_and(lost)) {
        "lost"
    } else {
        "failed"
    }
}

/// Records one renewal by the watchdog.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn renewed(
    backend: &'static str,
    name: &str,
    token: u64,
    result: &Result<std::time::Duration>,
) {
    let outcome = match result {
        Ok(_) => "renewed",
        Err(e) if matches!(e.kind(), ErrorKind::Lost | ErrorKind::NotHeld) => "lost",
        Err(_) => "failed",
    };
    match result {
        Ok(lease) => debug!(
            backend,
            lock = name,
            token,
            lease_ms = lease.as_millis() as u64,
            "renewed"
        ),
        Err(e) => warn!(backend, lock = name, token, outcome, error = %e, "renewal failed"),
    }
    #[cfg(feature = "metrics")]
    metrics::counter!("distlock_renewals_total", "backend" => backend, "outcome" => outcome)
        .increment(1);
}

/// Records a guard's lock lost (not given up).
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn lost(backend: &'static str, name: &str, token: u64, reason: &LostReason) {
    let label = match reason {
        LostReason::Expired => "expired",
        LostReason::Taken(_) => "taken",
        LostReason::Session(_) => "session",
        LostReason::ClientGone => "client_gone",
        LostReason::Released => return,
    };
    warn!(backend, lock = name, token, reason = label, detail = %reason, "lock lost");
    #[cfg(feature = "metrics")]
    metrics::counter!("distlock_locks_lost_total", "backend" => backend, "reason" => label)
        .increment(1);
}

/// What the background work after a lost answer was for.
#[derive(Clone, Copy)]
pub(crate) enum Settling {
    /// Giving back what an acquire may have left.
    GiveBack,
    /// Sending a release again.
    Release,
}

/// Records the start of background work after a lost answer.
pub(crate) fn settling(backend: &'static str, name: &str, what: Settling) {
    let job = match what {
        Settling::GiveBack => "give_back",
        Settling::Release => "release",
    };
    info!(
        backend,
        lock = name,
        job,
        "answer lost: settling in the background"
    );
}

/// Records the end of background work after a lost answer: `done` if the server answered (a
/// surplus hold was given back, a release was answered), else the lease ran out first — normal
/// for a give-back (the lost acquire was never applied), a warning for a release.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn settled(backend: &'static str, name: &str, what: Settling, done: bool) {
    let (job, outcome) = match (what, done) {
        (Settling::GiveBack, true) => ("give_back", "given_back"),
        (Settling::GiveBack, false) => ("give_back", "nothing_found"),
        (Settling::Release, true) => ("release", "released"),
        (Settling::Release, false) => ("release", "gave_up"),
    };
    if outcome == "gave_up" {
        warn!(
            backend,
            lock = name,
            job,
            outcome,
            "no answer before the lease ran out"
        );
    } else {
        info!(
            backend,
            lock = name,
            job,
            outcome,
            "settled in the background"
        );
    }
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "distlock_settled_total",
        "backend" => backend,
        "job" => job,
        "outcome" => outcome
    )
    .increment(1);
}
