//! Spawning server processes that cannot outlive the test process.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the
//! process. Test harnesses run each test on its own short-lived thread, so a server
//! shared by many tests must be forked from a thread that lives as long as the process:
//! every spawn goes through one such "spawner" thread.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

type SpawnJob = (Command, mpsc::Sender<io::Result<Child>>);

fn spawner() -> io::Result<mpsc::Sender<SpawnJob>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnJob>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        // The thread is detached on purpose: it must live until the process exits.
        let spawned = std::thread::Builder::new()
            .name("testkit-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(spawn_dying_with_parent(&mut cmd));
                }
            });
        if let Err(e) = spawned {
            eprintln!("testkit: cannot start the spawner thread: {e}");
        }
        Mutex::new(tx)
    });
    sender
        .lock()
        .map(|s| s.clone())
        .map_err(|_| io::Error::other("spawner lock poisoned"))
}

#[allow(unsafe_code)]
fn spawn_dying_with_parent(cmd: &mut Command) -> io::Result<Child> {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only calls
    // async-signal-safe functions (prctl, getppid, kill) without allocating.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if libc::getppid() == 1 {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// A server process, killed when dropped. Its output goes to `log`.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    log: PathBuf,
}

impl ServerProcess {
    /// Starts `program args...` with stdout and stderr appended to `log`.
    pub fn start(program: &Path, args: &[String], log: &Path) -> io::Result<Self> {
        Self::start_with_env(program, args, &[], log)
    }

    /// Like [`Self::start`], with extra environment variables for the child.
    pub fn start_with_env(
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: &Path,
    ) -> io::Result<Self> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let err = out.try_clone()?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        let (tx, rx) = mpsc::channel();
        spawner()?
            .send((cmd, tx))
            .map_err(|_| io::Error::other("spawner thread is gone"))?;
        let child = rx
            .recv()
            .map_err(|_| io::Error::other("spawner thread dropped the request"))??;
        Ok(Self {
            child,
            log: log.to_owned(),
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has exited (and with what status).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last `lines` lines of the server's log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Sends SIGTERM (a graceful stop request) without waiting.
    #[allow(unsafe_code)]
    pub fn terminate(&self) {
        // SAFETY: kill(2) on our own child's pid; no memory is shared.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
    }

    /// Waits up to `timeout` for the process to exit; `None` if it is still running.
    pub async fn wait_exit(
        &mut self,
        timeout: std::time::Duration,
    ) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Kills the process and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A free TCP port on 127.0.0.1 (bound, then released for the server to take).
pub fn free_port() -> io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A binary of this workspace built beside the running test (`target/<profile>/NAME`);
/// `cargo test --workspace` builds every one first, a single package's tests do not.
pub fn workspace_binary(name: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("the test binary has no target folder")?
        .join(name);
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!(
            "{} is missing: run `cargo build -p {name}` first (or test the workspace)",
            bin.display()
        ))
    }
}

/// Sends `signal` (`-STOP`, `-CONT`, ...) to `pid` with `kill`.
pub fn signal(pid: u32, signal: &str) -> Result<(), String> {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .map_err(|e| format!("kill {signal} {pid}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill {signal} {pid}: {status}"))
    }
}
