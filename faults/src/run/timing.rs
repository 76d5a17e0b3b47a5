//! The nemesis of the timing and topology rows: the private server's wall clock moved under
//! libfaketime (each move read back from the server, so a clock that did not move fails the
//! run instead of passing it), or one direction of a holder's link dropped.

use std::time::Duration;

use crate::matrix::{Timing, SKEW_RATE, SKEW_STEP_MS, STEP_S};
use crate::servers::{Deployment, Note};

/// The group id client process `p` runs with in the one-way rows: how the nftables rule in the
/// root namespace tells that process's packets from the other clients'.
pub(super) fn client_gid(p: usize) -> u32 {
    47_100 + p as u32
}

/// The client a one-way cut hits (a holder, where one was seen): its pid, its group id, and
/// how the note describes it.
pub(super) struct Holder {
    pub(super) pid: u32,
    pub(super) gid: u32,
    pub(super) described: String,
}

/// Plays `fault` on `d`; `Ok(Some(_))` is an error undoing it.
pub(super) async fn play(
    fault: Timing,
    d: &mut Deployment,
    ttl: Duration,
    holder: Option<Holder>,
    note: Note<'_>,
) -> Result<Option<String>, String> {
    match fault {
        Timing::ClockSkewSmall => {
            let read = step(
                d,
                &format!("+{:.3} x{}", SKEW_STEP_MS as f64 / 1000.0, SKEW_RATE),
                None,
            )
            .await?;
            note(
                format!(
                    "server clock stepped {SKEW_STEP_MS} ms forward, running x{SKEW_RATE} since \
                     its start ({read})"
                ),
                None,
                false,
                None,
            );
            tokio::time::sleep(ttl).await;
            note(
                "every lease granted before the step has ended".into(),
                None,
                true,
                None,
            );
        }
        Timing::ClockStepBack => {
            let read = step(d, &format!("-{STEP_S}"), Some(-STEP_S * 1000)).await?;
            note(
                format!("server clock stepped {STEP_S} s back ({read})"),
                None,
                false,
                None,
            );
            // Leases granted before the step end that much later on the server.
            tokio::time::sleep(ttl + Duration::from_secs(STEP_S as u64)).await;
            note(
                "every lease granted before the step has ended".into(),
                None,
                true,
                None,
            );
        }
        Timing::ClockStepForward => {
            for k in 1..=3 {
                let read = step(d, &format!("+{}", STEP_S * k), Some(STEP_S * 1000)).await?;
                note(
                    format!("server clock stepped {STEP_S} s forward ({read})"),
                    None,
                    false,
                    None,
                );
                tokio::time::sleep(ttl).await;
                note("a lease after the step".into(), None, true, None);
            }
        }
        Timing::OneWayToServer | Timing::OneWayFromServer => {
            let to_server = fault == Timing::OneWayToServer;
            let Holder {
                pid,
                gid,
                described,
            } = holder.ok_or("no client to cut off")?;
            d.cut_one_way(pid, gid, to_server)?;
            let what = if to_server {
                format!("dropped client {pid}'s packets to the server ({described})")
            } else {
                format!("dropped the server's packets to client {pid} ({described})")
            };
            note(what, None, false, None);
            tokio::time::sleep(ttl * 3 / 2).await;
            let undo = d.heal_one_way().err();
            note(format!("healed client {pid}'s link"), None, true, None);
            return Ok(undo);
        }
    }
    Ok(None)
}

/// Sets the server's clock to `spec` and reads it back; with `expect_ms`, fails unless the
/// server's clock moved by that much (within 250 ms). Returns what was read, for the note.
async fn step(d: &Deployment, spec: &str, expect_ms: Option<i64>) -> Result<String, String> {
    let before = d.clock_offset_ms().await?;
    d.set_clock(spec)?;
    let after = d.clock_offset_ms().await?;
    let moved = after - before;
    if let Some(want) = expect_ms {
        if (moved - want as f64).abs() > 250.0 {
            return Err(format!(
                "the server's clock moved {moved:+.1} ms, not {want:+} ms: libfaketime did not \
                 reach it"
            ));
        }
    }
    Ok(format!(
        "the server read {before:+.1} ms against this host before, {after:+.1} ms after"
    ))
}
