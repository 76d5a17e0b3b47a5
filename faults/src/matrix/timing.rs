//! The timing and topology faults (issue #40, item 4): a private server's wall clock skewed or
//! stepped under libfaketime, and one holder's traffic dropped in one direction only.

use super::Backend;

/// A fault of the server's clock or of one direction of a holder's link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timing {
    /// The server's clock runs fast by [`SKEW_RATE`] from its start and is stepped forward by
    /// [`SKEW_STEP_MS`] while clients hold: together less than the drift margin
    /// (`distlock_api::drift`, 1 % + 2 ms: 12 ms of a 1 s lease).
    ClockSkewSmall,
    /// The server's clock stepped back by [`STEP_S`] while clients hold: leases granted before
    /// the step last that much longer on the server; none ends early.
    ClockStepBack,
    /// The negative control: the server's clock stepped forward by [`STEP_S`] (three leases),
    /// three times a lease apart, while clients hold. Run only by name (the known-defects
    /// gate), never by the campaign.
    ClockStepForward,
    /// One holder's packets to the server dropped (nftables), the server's to it delivered.
    OneWayToServer,
    /// The server's packets to one holder dropped, the holder's to the server delivered.
    OneWayFromServer,
}

/// The clock skew of `clock-skew-small`, as libfaketime's rate (from the server's start: a
/// rate written later would jump the clock by the uptime times the rate).
pub(crate) const SKEW_RATE: &str = "1.003";
/// The step of `clock-skew-small`, in ms: with the rate's 3 ms a lease, 7 of the 12 ms margin.
pub(crate) const SKEW_STEP_MS: i64 = 4;
/// The step of `clock-step-back` and `clock-step-forward`, in seconds: three 1 s leases.
pub(crate) const STEP_S: i64 = 3;

impl Timing {
    pub(crate) fn key(self) -> &'static str {
        match self {
            Timing::ClockSkewSmall => "clock-skew-small",
            Timing::ClockStepBack => "clock-step-back",
            Timing::ClockStepForward => "clock-step-forward",
            Timing::OneWayToServer => "one-way-to-server",
            Timing::OneWayFromServer => "one-way-from-server",
        }
    }

    pub(crate) fn what(self) -> &'static str {
        match self {
            Timing::ClockSkewSmall => {
                "a private server under libfaketime whose clock runs 0.3 % fast from its start \
                 and is stepped 4 ms forward while clients hold: within the drift margin \
                 (1 % + 2 ms), so exclusion must hold"
            }
            Timing::ClockStepBack => {
                "a private server's clock stepped 3 s (three leases) back while clients hold \
                 (libfaketime): leases granted before it last longer on the server, none ends \
                 early"
            }
            Timing::ClockStepForward => {
                "negative control, run by the known-defects gate only: a private server's clock \
                 stepped 3 s (three leases) forward, three times a lease apart, while clients \
                 hold; live leases end early on the server while their holders still believe \
                 (the hazard the docs of backends that judge leases by the server's clock name)"
            }
            Timing::OneWayToServer => {
                "one holder's packets to the private server dropped (nftables, matched by the \
                 client process's group), the server's to it delivered, past the lease; healed"
            }
            Timing::OneWayFromServer => {
                "the private server's packets to one holder dropped (nftables, the holder's \
                 connections marked by its group), the holder's to the server delivered: its \
                 requests are applied, their answers lost, past the lease; healed"
            }
        }
    }

    /// Whether the fault moves the server's clock (so the server runs under libfaketime).
    pub(crate) fn clock(self) -> bool {
        matches!(
            self,
            Timing::ClockSkewSmall | Timing::ClockStepBack | Timing::ClockStepForward
        )
    }

    /// The timestamp file's content when the server starts.
    pub(crate) fn initial_clock(self) -> String {
        match self {
            Timing::ClockSkewSmall => format!("+0 x{SKEW_RATE}"),
            _ => "+0".into(),
        }
    }

    /// How many leases the clients run on after the base time.
    pub(crate) fn leases_after(self) -> u32 {
        match self {
            Timing::ClockStepForward => 4,
            Timing::ClockStepBack => 5,
            _ => 3,
        }
    }

    /// Whether it runs on `backend`, or why not.
    pub(crate) fn applies(self, backend: &Backend) -> Result<(), &'static str> {
        let key = backend.key();
        if self.clock() {
            return match key {
                "mysql" | "postgres" | "mongo" => Ok(()),
                "postgres-advisory" if self == Timing::ClockSkewSmall => Ok(()),
                "postgres-advisory" if self == Timing::ClockStepBack => Err(
                    "not clean, so left out (a finding, not a pass): stepped 3 s back, \
                     PostgreSQL 15 ended holders' sessions for idle_session_timeout (advisory \
                     mode's session bound) while they were active, and the holders believed on \
                     until their next probe or safe-until (8 and 10 overlaps in 2 runs; psql \
                     alone shows the early end); backend-postgres/docs.md",
                ),
                "postgres-advisory" => Err(
                    "not run: advisory locks live as long as their session, whose bound \
                     (idle_session_timeout) is the server's own timer; what a forward step does \
                     to it was not tried",
                ),
                "redis" | "redlock" => Err(
                    "libfaketime cannot run Debian's redis-server: it allocates with jemalloc, \
                     whose start-up calls clock_gettime before libfaketime is initialised, and \
                     the server hangs (libfaketime issue #130); no Redis clock is moved",
                ),
                "etcd" => Err(
                    "Go reads the clock through the vDSO, not libc, so libfaketime cannot move \
                     etcd's clock; its leases count on Go's monotonic clock",
                ),
                "zk" => Err(
                    "not run: sessions expire on the JVM's monotonic clock (System.nanoTime), \
                     which a wall-clock step leaves alone; the JVM under libfaketime was not tried",
                ),
                _ => Err("no private server whose clock libfaketime can move"),
            };
        }
        match key {
            "redlock" => Err(
                "the redis rows cut one server's link; a RedLock master out of reach is the \
                 masters-down rows",
            ),
            _ => Ok(()),
        }
    }

    /// Whether the quick campaign runs it on `backend` (the full one runs every cell): one
    /// cell of each kind of fault, the cheapest servers, about 40 s together. The negative
    /// control runs wherever it is named, quick or not.
    pub(crate) fn quick(self, backend: &Backend) -> bool {
        matches!(
            (self, backend.key()),
            (Timing::ClockStepForward, _)
                | (Timing::ClockSkewSmall, "postgres")
                | (Timing::OneWayToServer, "redis")
                | (Timing::OneWayFromServer, "redis")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::{backends, Scenario, NEGATIVE_CONTROLS, SCENARIOS};
    use super::*;

    /// The timing faults the campaign runs.
    const TIMING: [Timing; 4] = [
        Timing::ClockSkewSmall,
        Timing::ClockStepBack,
        Timing::OneWayToServer,
        Timing::OneWayFromServer,
    ];

    fn ran_on(s: Scenario) -> Vec<&'static str> {
        backends()
            .iter()
            .filter(|b| s.applies(b).is_ok())
            .map(Backend::key)
            .collect()
    }

    #[test]
    fn clock_faults_run_only_where_libfaketime_reaches_a_server_that_judges_leases() {
        let skew = Scenario::Timing(Timing::ClockSkewSmall);
        let back = Scenario::Timing(Timing::ClockStepBack);
        let forward = Scenario::Timing(Timing::ClockStepForward);
        assert_eq!(
            ran_on(skew),
            ["mysql", "postgres", "postgres-advisory", "mongo"]
        );
        // Advisory mode under a step back is a finding, not a clean cell (see its reason).
        assert_eq!(ran_on(back), ["mysql", "postgres", "mongo"]);
        assert_eq!(ran_on(forward), ["mysql", "postgres", "mongo"]);
        // Redis's reason names the jemalloc clash, not a safety claim.
        let redis = backends().into_iter().find(|b| b.key() == "redis").unwrap();
        assert!(skew.applies(&redis).unwrap_err().contains("jemalloc"));
        for s in [skew, back, forward] {
            assert_eq!(s.members(), 1, "{s:?}");
            assert!(
                !s.proxied() && !s.clustered() && s.topology().is_none(),
                "{s:?}"
            );
        }
    }

    #[test]
    fn one_way_cuts_run_on_every_single_server_backend() {
        for t in [Timing::OneWayToServer, Timing::OneWayFromServer] {
            assert!(!t.clock());
            assert_eq!(
                ran_on(Scenario::Timing(t)),
                [
                    "redis",
                    "mysql",
                    "postgres",
                    "postgres-advisory",
                    "mongo",
                    "zk",
                    "etcd"
                ],
                "{t:?}"
            );
        }
    }

    #[test]
    fn the_forward_step_is_a_negative_control_only_run_by_name() {
        let forward = Scenario::Timing(Timing::ClockStepForward);
        assert!(!SCENARIOS.contains(&forward));
        assert_eq!(NEGATIVE_CONTROLS, [forward]);
        assert_eq!(Scenario::parse("clock-step-forward"), Some(forward));
        for t in TIMING {
            assert_eq!(Scenario::parse(t.key()), Some(Scenario::Timing(t)));
            assert!(SCENARIOS.contains(&Scenario::Timing(t)));
        }
    }

    #[test]
    fn quick_mode_runs_one_applicable_cell_of_each_new_fault() {
        let all = backends();
        let quick: Vec<(&str, &str)> = TIMING
            .iter()
            .flat_map(|&t| all.iter().map(move |b| (t, b)))
            .filter(|(t, b)| t.quick(b))
            .inspect(|(t, b)| assert!(t.applies(b).is_ok(), "{t:?} × {b:?}"))
            .map(|(t, b)| (t.key(), b.key()))
            .collect();
        assert_eq!(
            quick,
            [
                ("clock-skew-small", "postgres"),
                ("one-way-to-server", "redis"),
                ("one-way-from-server", "redis"),
            ]
        );
        // The campaign's other rows all run in quick mode.
        assert!(all.iter().all(|b| Scenario::Baseline.quick(b)));
    }
}
