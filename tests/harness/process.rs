//! Child processes of the harness: reading their output line by line,
//! spawning one tied to this process's life, and stopping one by a signal
//! with a bounded wait.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Calls `f` with every line of `pipe`, on a thread of its own, until the
/// pipe closes; the pipe is drained to the end, so its writer never blocks
/// on (or dies of) a full or closed pipe.
pub fn each_line(pipe: impl Read + Send + 'static, mut f: impl FnMut(String) + Send + 'static) {
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            f(line);
        }
    });
}

/// Collects a child's stdout and stderr, line by line, into one log.
pub fn capture_output(child: &mut Child) -> Arc<Mutex<String>> {
    let log = Arc::new(Mutex::new(String::new()));
    for pipe in [
        Box::new(child.stdout.take().expect("stdout")) as Box<dyn Read + Send>,
        Box::new(child.stderr.take().expect("stderr")),
    ] {
        let sink = log.clone();
        each_line(pipe, move |line| sink.lock().expect("log lock").push_str(&(line + "\n")));
    }
    log
}

/// `program` run under `setpriv --pdeathsig TERM` (util-linux): the kernel
/// sends it SIGTERM when the thread that spawned it ends. For the benches,
/// which can be interrupted (Ctrl-C, a timeout's SIGKILL) where no `Drop`
/// runs; tests end by unwinding, and spawn their processes from test
/// threads that end before the process should. Spawn from the main thread.
pub fn tied(program: &str) -> Command {
    let mut command = Command::new("setpriv");
    command.args(["--pdeathsig", "TERM", "--", program]);
    command
}

/// A child process, killed on drop unless [`Owned::stop`] stopped it first.
pub struct Owned {
    child: Child,
    stopped: bool,
}

impl Owned {
    pub fn new(child: Child) -> Self {
        Self { child, stopped: false }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, once it has exited.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILL; returns once it has exited.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends `signal` (`INT`, `TERM`) and waits up to `grace` for it to
    /// exit; then SIGKILL. Returns once it has exited; only the first call
    /// does anything.
    pub fn stop(&mut self, signal: &str, grace: Duration) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        let _ = Command::new("kill").args([&format!("-{signal}"), &self.id().to_string()]).status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        self.kill();
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if !self.stopped {
            self.kill();
        }
    }
}

/// A process stopped with SIGSTOP (a frozen API server: the kernel still
/// accepts its connections, nothing answers), continued when dropped, also
/// when a test or bench fails: a stopped process would never see the
/// supervisor's SIGTERM.
pub struct Frozen(u32);

impl Frozen {
    pub fn new(pid: u32) -> Self {
        signal(pid, "STOP");
        Self(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(self.0, "CONT");
    }
}

/// `kill -SIG pid`; panics when it fails.
pub fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{sig} {pid}");
}
