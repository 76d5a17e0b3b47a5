//! A soak's nemesis: a fault drawn from the plan's pool every 3 to 10 s, sometimes one on the
//! clients and one on the server at once, each played by the campaign's own fault actions
//! ([`play()`]); a killed client is replaced, so that the load stays.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{play, Clients, Route, Stage};
use crate::matrix::Scenario;
use crate::servers::Deployment;

/// What a soak of one backend plays (made by `soak.rs`).
pub(crate) struct Plan {
    /// The faults to draw from.
    pub(crate) pool: Vec<Scenario>,
    /// How often each was drawn (and how often two were played at once).
    pub(crate) drawn: Mutex<BTreeMap<&'static str, usize>>,
}

/// How long before the end no new fault starts: room for the last one's aftermath (a
/// restarted member catching up, leases running out) before the clients stop.
fn tail(ttl: Duration) -> Duration {
    ttl * 6 + Duration::from_secs(15)
}

/// Plays faults until `end`; `Ok(Some(_))` names what went wrong undoing them. A fault that
/// cannot be played at all (a server that did not come back) stops the nemesis and is returned
/// as that error, so the soak reports it instead of going on against a broken deployment.
pub(crate) async fn nemesis(
    plan: &Plan,
    stage: &Stage<'_>,
    server: &mut Option<Deployment>,
    clients: &mut Clients,
    routes: &[Route],
    end: Instant,
) -> Result<Option<String>, String> {
    let mut errors = Vec::new();
    let mut rng = fastrand::Rng::new();
    while Instant::now() + tail(stage.ttl) < end {
        if !clients.replace_exited(end)?.is_empty() {
            // A client connects before it loops, and one whose server or link a fault takes
            // while it connects fails to start (an 8-minute soak lost two that way): the next
            // fault waits for it.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let started = Instant::now();
        let (a, b) = plan.draw(&mut rng);
        let played = match b {
            None => play(a, stage, server, None, clients, routes).await,
            Some(b) => {
                // One on the clients, one on the server: disjoint, so both borrow what they act on.
                let mut no_server = None;
                let mut no_clients = Clients::default();
                let (ra, rb) = tokio::join!(
                    play(a, stage, &mut no_server, None, clients, routes),
                    play(b, stage, server, None, &mut no_clients, routes),
                );
                match (ra, rb) {
                    (Ok(x), Ok(y)) => Ok(x.into_iter().chain(y).reduce(|x, y| x + "; " + &y)),
                    (Err(e), _) | (_, Err(e)) => Err(e),
                }
            }
        };
        let what = b.map_or_else(
            || a.key().to_string(),
            |b| format!("{} + {}", a.key(), b.key()),
        );
        stage.note_over(format!("{what} over"));
        match played {
            Ok(None) => {}
            Ok(Some(e)) => errors.push(format!("{what}: {e}")),
            Err(e) => {
                errors.push(format!("{what}: {e} (the nemesis stopped here)"));
                break;
            }
        }
        let gap = Duration::from_millis(rng.u64(3000..=10_000));
        let next = (started + gap).max(Instant::now() + Duration::from_millis(500));
        tokio::time::sleep_until(next.into()).await;
    }
    clients.replace_exited(end)?;
    Ok((!errors.is_empty()).then(|| errors.join("; ")))
}

impl Plan {
    /// The next fault, and sometimes a second one to play at once: the first on the clients,
    /// the second on the server.
    fn draw(&self, rng: &mut fastrand::Rng) -> (Scenario, Option<Scenario>) {
        let on_clients: Vec<Scenario> = self
            .pool
            .iter()
            .copied()
            .filter(|s| pairs_on_clients(*s))
            .collect();
        let on_server: Vec<Scenario> = self
            .pool
            .iter()
            .copied()
            .filter(|s| s.members() > 0)
            .collect();
        let drawn = if !on_clients.is_empty() && !on_server.is_empty() && rng.u8(..4) == 0 {
            (
                on_clients[rng.usize(..on_clients.len())],
                Some(on_server[rng.usize(..on_server.len())]),
            )
        } else {
            (self.pool[rng.usize(..self.pool.len())], None)
        };
        let mut counts = self.drawn.lock().expect("drawn");
        *counts.entry(drawn.0.key()).or_default() += 1;
        if let Some(b) = drawn.1 {
            *counts.entry(b.key()).or_default() += 1;
            *counts.entry("(two at once)").or_default() += 1;
        }
        drawn
    }
}

/// Whether `s` acts on the clients alone and can run beside a fault on the server. An
/// out-of-band deletion goes to the server as an admin, so it is not paired with a server that
/// is stopped or down.
fn pairs_on_clients(s: Scenario) -> bool {
    s.members() == 0 && s != Scenario::OobDelete
}
