//! A peer's harness program as a child process, spoken to in the line protocol of [`protocol`].
//! The child is killed when this is dropped, so a bench that fails or is interrupted leaves no
//! harness behind.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::protocol::{self, Hello, Reply};
use super::Driver;
use crate::error::Res;
use crate::run::contention::HotRecord;
use crate::run::scenarios::Measured;
use crate::run::stats::Recorder;

/// Lines of the harness's stderr kept for error messages.
const STDERR_LINES: usize = 12;

pub(crate) struct Harness {
    /// The program, for messages.
    program: String,
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    hello: Hello,
    /// Each command's answer must come within this.
    bound: Duration,
    /// Set after a command timed out: the child was killed.
    dead: bool,
}

impl Harness {
    /// Starts `cmd` and waits for its hello (the harness connects to the server first).
    pub(crate) async fn start(mut cmd: Command, bound: Duration) -> Res<Self> {
        let program = cmd.as_std().get_program().to_string_lossy().into_owned();
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {program}: {e}"))?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(format!("{program}: its pipes were not set up").into());
        };
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        {
            let tail = tail.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                    if t.len() == STDERR_LINES {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            });
        }
        let mut harness = Harness {
            program,
            child,
            stdin,
            stdout: BufReader::new(stdout).lines(),
            stderr: tail,
            hello: Hello {
                library: String::new(),
                version: String::new(),
                runtime: String::new(),
                contenders: String::new(),
            },
            bound,
            dead: false,
        };
        match harness.read("start").await? {
            Reply::Hello(hello) => harness.hello = hello,
            other => return Err(harness.unexpected("start", &other).into()),
        }
        Ok(harness)
    }

    /// The next reply, within the bound.
    async fn read(&mut self, what: &str) -> Res<Reply> {
        match tokio::time::timeout(self.bound, self.stdout.next_line()).await {
            Ok(Ok(Some(line))) => match protocol::parse(&line)? {
                Reply::Error(e) => Err(format!("{}: {what}: {e}", self.program).into()),
                reply => Ok(reply),
            },
            Ok(Ok(None)) => {
                // Let the stderr reader catch up with the child's last words.
                tokio::time::sleep(Duration::from_millis(100)).await;
                Err(format!(
                    "{}: exited during {what}{}",
                    self.program,
                    self.stderr_tail()
                )
                .into())
            }
            Ok(Err(e)) => Err(format!("{}: reading its output: {e}", self.program).into()),
            Err(_) => {
                self.dead = true;
                let _ = self.child.start_kill();
                Err(format!(
                    "{}: no answer to {what} within {:?}; stopped it{}",
                    self.program,
                    self.bound,
                    self.stderr_tail()
                )
                .into())
            }
        }
    }

    async fn ask(&mut self, command: String) -> Res<Reply> {
        let verb = self.send(&command).await?;
        self.read(&verb).await
    }

    /// Writes `command` without waiting for its answer; returns its verb.
    async fn send(&mut self, command: &str) -> Res<String> {
        if self.dead {
            return Err(format!("{}: stopped after an earlier timeout", self.program).into());
        }
        let verb = command.split(' ').next().unwrap_or("command").to_string();
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .map_err(|e| format!("{}: cannot send {verb}: {e}", self.program))?;
        self.stdin.flush().await?;
        Ok(verb)
    }

    /// Sends `command` and expects `{"ok":{}}`.
    pub(crate) async fn ok(&mut self, command: String) -> Res<()> {
        match self.ask(command).await? {
            Reply::Ok {} => Ok(()),
            other => Err(self.unexpected("an election command", &other).into()),
        }
    }

    /// Sends `command`; its `{"ok":{}}` is read by [`Self::answered`].
    pub(crate) async fn ask_later(&mut self, command: String) -> Res<()> {
        self.send(&command).await.map(drop)
    }

    /// The `{"ok":{}}` answer of a command sent with [`Self::ask_later`].
    pub(crate) async fn answered(&mut self) -> Res<()> {
        match self.read("observe").await? {
            Reply::Ok {} => Ok(()),
            other => Err(self.unexpected("observe", &other).into()),
        }
    }

    /// Kills the harness process with SIGKILL, as a crash would: its sessions and leases are
    /// never closed, the server has to expire them. Does not wait for it to exit.
    pub(crate) fn kill(&mut self) -> Res<()> {
        if self.dead {
            return Ok(());
        }
        self.dead = true;
        self.child
            .start_kill()
            .map_err(|e| format!("{}: cannot kill it: {e}", self.program).into())
    }

    fn unexpected(&self, what: &str, reply: &Reply) -> String {
        let kind = match reply {
            Reply::Hello(_) => "hello",
            Reply::Cycle(_) => "cycle",
            Reply::Hot(_) => "hot",
            Reply::Wake(_) => "wake",
            Reply::Ok {} => "ok",
            Reply::Error(_) => "error",
        };
        format!("{}: answered {what} with a {kind} reply", self.program)
    }

    fn stderr_tail(&self) -> String {
        let tail = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        if tail.is_empty() {
            String::new()
        } else {
            format!("; its stderr ends: {}", Vec::from(tail.clone()).join(" / "))
        }
    }
}

#[async_trait]
impl Driver for Harness {
    fn hello(&self) -> Hello {
        self.hello.clone()
    }

    async fn cycle(&mut self, name: &str, run: Duration) -> Res<Measured> {
        match self.ask(protocol::cycle_command(name, run)?).await? {
            Reply::Cycle(samples) => samples.measured(),
            other => Err(self.unexpected("cycle", &other).into()),
        }
    }

    async fn hot(&mut self, name: &str, clients: usize, run: Duration) -> Res<HotRecord> {
        match self.ask(protocol::hot_command(name, clients, run)?).await? {
            Reply::Hot(raw) => raw.record(clients),
            other => Err(self.unexpected("hot", &other).into()),
        }
    }

    async fn wake(
        &mut self,
        prefix: &str,
        samples: u32,
        delay: (Duration, Duration),
    ) -> Res<Recorder> {
        match self
            .ask(protocol::wake_command(prefix, samples, delay)?)
            .await?
        {
            Reply::Wake(s) => s.recorder(),
            other => Err(self.unexpected("wake", &other).into()),
        }
    }

    async fn permit(&mut self, name: &str, max: u32, run: Duration) -> Res<Measured> {
        match self.ask(protocol::permit_command(name, max, run)?).await? {
            Reply::Cycle(samples) => samples.measured(),
            other => Err(self.unexpected("permit", &other).into()),
        }
    }

    async fn close(mut self: Box<Self>) {
        if !self.dead {
            let _ = self.stdin.write_all(b"quit\n").await;
            let _ = self.stdin.flush().await;
            if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
                .await
                .is_ok()
            {
                return;
            }
        }
        let _ = self.child.kill().await;
    }
}
