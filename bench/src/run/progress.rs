//! The progress bar on stderr. indicatif hides the bar itself when stderr is not a terminal
//! (CI, `scripts/test`), so notes are printed as plain lines there instead.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub(crate) struct Progress {
    bar: ProgressBar,
    tty: bool,
}

impl Progress {
    pub(crate) fn new(steps: usize) -> Self {
        let tty = std::io::stderr().is_terminal();
        let bar = ProgressBar::with_draw_target(Some(steps as u64), ProgressDrawTarget::stderr());
        // The template is a constant; if indicatif ever refused it, the default style would do.
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {wide_msg}",
        ) {
            bar.set_style(style);
        }
        if tty {
            bar.enable_steady_tick(Duration::from_millis(120));
        }
        Self { bar, tty }
    }

    /// Shows what is running now.
    pub(crate) fn stage(&self, backend: &str, what: &str) {
        let msg = format!("{backend}: {what}");
        if !self.tty {
            // Without a bar, a log line per stage shows where a slow or stuck run is.
            eprintln!("  .. {msg}");
        }
        self.bar.set_message(msg);
    }

    /// One step done.
    pub(crate) fn step(&self) {
        self.bar.inc(1);
    }

    /// Steps that will not run (an unavailable backend).
    pub(crate) fn skip(&self, steps: usize) {
        self.bar.inc(steps as u64);
    }

    /// A line that stays, above the bar.
    pub(crate) fn note(&self, line: &str) {
        if self.tty {
            self.bar.println(line);
        } else {
            eprintln!("{line}");
        }
    }

    pub(crate) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
