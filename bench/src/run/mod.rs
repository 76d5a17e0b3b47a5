//! Running the benchmark: every scenario against every backend that answers, the Rust peers
//! (rslock, sqlx) and the peer libraries, filling the [model](crate::model). Nothing here knows how the
//! report looks; the lines it prints as it goes are handed in by the caller.

mod contention;
mod counting;
pub(crate) mod libraries;
mod machine;
mod peer;
pub(crate) mod plan;
pub(crate) mod prims;
mod progress;
mod scenarios;
mod stats;
pub(crate) mod targets;

use std::time::Instant;

use crate::model::{BackendResult, Kind, LibraryResult, Machine, Meta, Results, Status};

use self::libraries::Library;
use self::plan::Plan;
use self::progress::Progress;

/// What to run, as the command line asked for it.
pub(crate) struct Selection<'a> {
    pub(crate) quick: bool,
    pub(crate) kinds: &'a [Kind],
    /// Whether to run the rslock peer.
    pub(crate) peer: bool,
    pub(crate) libraries: &'a [Library],
    /// The benchmark's arguments as given, for the report's header.
    pub(crate) args: &'a [String],
    pub(crate) sections: crate::cli::Sections,
}

/// The one-line summaries printed under the progress bar as each backend and library
/// finishes.
pub(crate) struct Lines {
    pub(crate) backend: fn(&BackendResult) -> String,
    pub(crate) library: fn(&LibraryResult) -> String,
}

/// Runs what `sel` asks for and returns what was measured.
pub(crate) async fn all(sel: &Selection<'_>, lines: &Lines) -> Results {
    let started = Instant::now();
    let plan = if sel.quick {
        Plan::quick()
    } else {
        Plan::full()
    };
    let mut meta = collect_meta(sel.args, &plan);
    let s = sel.sections;
    let lock_libraries = sel.libraries.iter().filter(|l| l.locks()).count();
    let steps: usize = match s.locks {
        true => {
            sel.kinds.iter().map(|&k| Plan::steps(k)).sum::<usize>()
                + lock_libraries * libraries::STEPS
        }
        false => 0,
    };
    let prim_steps = prims::steps(sel.kinds, sel.libraries, s.permits, s.failover);
    let sqlx_peer = s.locks && sel.kinds.contains(&Kind::Postgres);
    let progress = Progress::new(steps + sel.peer as usize + sqlx_peer as usize + prim_steps);

    let mut backends = Vec::new();
    let mut peers = Vec::new();
    let mut libraries = Vec::new();
    if s.locks {
        for &kind in sel.kinds {
            backends.push(run_backend(kind, &plan, &progress, lines.backend).await);
        }
        if sel.peer {
            progress.stage("rslock", "peer cycle");
            peers = peer::run(&plan, &progress, sel.kinds.contains(&Kind::Redlock)).await;
            progress.step();
        }
        if sqlx_peer {
            progress.stage("sqlx", "peer cycle");
            peers.extend(peer::sqlx(&plan, &progress).await);
            progress.step();
        }
        libraries = libraries::run(sel.libraries, &plan, &progress, &backends, lines.library).await;
    }
    let primitives = if s.permits || s.failover {
        let which = (s.permits, s.failover);
        Some(prims::run(sel.kinds, sel.libraries, which, &plan, &progress).await)
    } else {
        None
    };
    progress.finish();

    meta.duration_s = started.elapsed().as_secs_f64();
    Results {
        meta,
        backends,
        peers,
        libraries,
        primitives,
    }
}

/// Connects to one backend and runs every scenario on it; a scenario that fails records its
/// error and the rest still run.
async fn run_backend(
    kind: Kind,
    plan: &Plan,
    progress: &Progress,
    line: fn(&BackendResult) -> String,
) -> BackendResult {
    progress.stage(kind.id(), "connecting");
    let started = Instant::now();
    let mut result = new_backend(kind);
    let target = match targets::open(kind).await {
        Ok(t) => t,
        Err(e) => {
            result.status = Status::Unavailable {
                error: e.to_string(),
                how_to_start: kind.how_to_start(),
            };
            progress.note(&format!("{}: unavailable ({e})", kind.id()));
            progress.skip(Plan::steps(kind));
            return result;
        }
    };
    result.status = Status::Available {
        server: target
            .server_version()
            .await
            .unwrap_or_else(|e| format!("unknown ({e})")),
        url: target.url(),
    };
    scenarios::run_all(&*target, plan, progress, &mut result).await;
    if let Err(e) = target.cleanup().await {
        progress.note(&format!("{}: cleanup failed: {e}", kind.id()));
    }
    result.took_s = started.elapsed().as_secs_f64();
    progress.note(&line(&result));
    result
}

/// The header of a run about to start.
fn collect_meta(args: &[String], plan: &Plan) -> Meta {
    let quoted: Vec<String> = args.iter().map(|a| shell_quote(a)).collect();
    let direct = format!("distlock-bench {}", quoted.join(" "));
    let command = std::env::var("DISTLOCK_BENCH_COMMAND")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .unwrap_or_else(|| direct.trim_end().to_string());
    Meta {
        command,
        args: args.to_vec(),
        date_utc: machine::now_utc(),
        mode: if plan.quick { "quick" } else { "full" }.into(),
        profile: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
        .into(),
        machine: Machine::collect(),
        duration_s: 0.0,
        version: env!("CARGO_PKG_VERSION").into(),
    }
}

fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=,:@%+".contains(c));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// A backend's result before anything ran.
fn new_backend(kind: Kind) -> BackendResult {
    BackendResult {
        id: kind.id().into(),
        label: kind.label().into(),
        status: Status::NotRun,
        blocking: None,
        uncontended: None,
        independent: Vec::new(),
        hot: Vec::new(),
        hot_one_handle: None,
        wake: None,
        many: None,
        paused_master: None,
        errors: Vec::new(),
        took_s: 0.0,
    }
}
