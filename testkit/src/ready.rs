//! Waiting for a server to answer a real call, failing fast when it exits.

use crate::TestEnvError;
use crate::process::ServerProcess;
use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `probe` every 100 ms until it succeeds, the process exits, or `timeout` passes.
pub(crate) async fn wait_ready<F, Fut>(
    name: &'static str,
    process: &mut ServerProcess,
    timeout: Duration,
    mut probe: F,
) -> Result<(), TestEnvError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    loop {
        let last_error = match tokio::time::timeout(Duration::from_secs(5), probe()).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e,
            Err(_) => "probe timed out after 5s".into(),
        };
        if let Some(status) = process.exited() {
            return Err(TestEnvError::NotReady {
                name,
                seconds: started.elapsed().as_secs(),
                last_error: format!("process exited with {status}; last probe: {last_error}"),
                log_tail: process.log_tail(30),
            });
        }
        if started.elapsed() > timeout {
            return Err(TestEnvError::NotReady {
                name,
                seconds: timeout.as_secs(),
                last_error,
                log_tail: process.log_tail(30),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
