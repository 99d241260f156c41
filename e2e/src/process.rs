//! Containers' processes as this machine sees them: the tests run on the node, so a
//! container's devices and environment are readable under `/proc/<pid>` (`root/`,
//! `environ`) as the container has them.

use std::path::PathBuf;

/// The `/proc` folder of the process whose environment names `POD_NAME=pod` (the
/// operator's downward-API variable) and whose arguments `argv_matches`.
pub fn container_process(pod: &str, argv_matches: impl Fn(&[String]) -> bool) -> Option<PathBuf> {
    let needle = format!("POD_NAME={pod}");
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let argv: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            (environ.split(|b| *b == 0).any(|v| v == needle.as_bytes()) && argv_matches(&argv))
                .then(|| entry.path())
        })
}
