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

/// Sends `signal` (`INT`, `TERM`) to `child` and waits up to `grace` for it
/// to exit; then SIGKILL. Returns once it has exited.
pub fn stop(child: &mut Child, signal: &str, grace: Duration) {
    let _ = Command::new("kill").args([&format!("-{signal}"), &child.id().to_string()]).status();
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}
