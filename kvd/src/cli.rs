//! The `infera-kvd` command line: the socket, the RAM tier and its shared arena, the NVMe
//! tier (L3) and the distributed tier (L4); `infera-kvd stats` prints the counters.

use crate::disk::device::IoMode;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// The KV-cache daemon: engines offload KV blocks over a Unix socket (length-prefixed
/// msgpack, the earlier daemon's protocol) and read them in place from a shared memfd
/// arena. Sizes are in bytes.
#[derive(Debug, Parser)]
#[command(name = "infera-kvd", version, about, long_about = None, args_override_self = true)]
pub struct KvdArgs {
    // What to do instead of serving (`stats`); none: serve.
    #[allow(missing_docs)]
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Unix socket to serve (owner-only).
    #[arg(
        long,
        env = "INFERA_KVD_SOCKET",
        default_value = "/tmp/infera-kvd.sock",
        global = true
    )]
    pub socket: PathBuf,
    /// Most bytes held in RAM (arena slots and values larger than a slot).
    #[arg(long, default_value_t = 1 << 30)]
    pub max_bytes: u64,
    /// Size of the shared arena (0: none; values are then answered inline). Default:
    /// --max-bytes.
    #[arg(long)]
    pub shared_arena_bytes: Option<u64>,
    /// Largest value accepted.
    #[arg(long, default_value_t = 64 << 20)]
    pub max_value_bytes: usize,
    /// Back the arena with huge pages.
    #[arg(long)]
    pub hugetlb: bool,
    /// Lock the arena in RAM.
    #[arg(long)]
    pub mlock: bool,
    /// Address of /metrics (empty: off). Loopback unless told otherwise: the operator
    /// gives `0.0.0.0:9401` so its PodMonitor can scrape the pod.
    #[arg(long, default_value = "127.0.0.1:9401")]
    pub metrics_addr: String,
    /// Also accept clients running as this uid (repeatable; the daemon's own user is
    /// always accepted). Engines of vendor images run as root: `--allow-uid 0`.
    #[arg(long)]
    pub allow_uid: Vec<u32>,
    /// Name in hello_ack.
    #[arg(long, default_value = "infera-kvd")]
    pub server_id: String,
    /// Log lines as JSON.
    #[arg(long)]
    pub log_json: bool,
    /// L3 (NVMe tier): a directory for `long` entries, one per device (repeatable;
    /// entries are striped over them by key hash). Each holds a pre-allocated container
    /// file, a journal and a metadata file.
    #[arg(long, help_heading = "NVMe tier (L3)")]
    pub long_path: Vec<PathBuf>,
    /// L3 directories, comma-separated (added to --long-path).
    #[arg(long, value_delimiter = ',', help_heading = "NVMe tier (L3)")]
    pub long_paths: Vec<PathBuf>,
    /// L3 container bytes over all devices, split evenly. Default: an existing
    /// container's size, else half of each filesystem's free space.
    #[arg(long, help_heading = "NVMe tier (L3)")]
    pub long_bytes: Option<u64>,
    /// Free bytes the L3 leaves on each filesystem: the container is sized below it, and
    /// writes stop (counted as `below_floor`) while the filesystem is under it.
    #[arg(long, default_value_t = 1 << 30, help_heading = "NVMe tier (L3)")]
    pub long_min_free_bytes: u64,
    /// L3 slot size. Default: the first `long` value's size, rounded up to 4 KiB (values
    /// larger than a slot stay in RAM and L4).
    #[arg(long, help_heading = "NVMe tier (L3)")]
    pub long_slot_bytes: Option<u64>,
    /// Most bytes waiting to be written to each L3 device (more are dropped, counted).
    #[arg(long, default_value_t = 512 << 20, help_heading = "NVMe tier (L3)")]
    pub long_queue_bytes: u64,
    /// L3 backend: `file` (container files on local disks) is the only one.
    #[arg(long, default_value = "file", help_heading = "NVMe tier (L3)")]
    pub long_backend: String,
    /// L3 I/O: `auto` (O_DIRECT where the filesystem allows, else buffered with a
    /// warning; ramfs, older tmpfs and some overlay or FUSE mounts refuse it), `direct` (refuse to start without it) or
    /// `buffered`.
    #[arg(long, default_value = "auto", help_heading = "NVMe tier (L3)")]
    pub io_mode: IoMode,
    /// L4 (distributed tier): `redis://[user[:password]@]host[:port][/db]` or
    /// `valkey://...`. `long` entries are written behind; misses are read through. From
    /// the environment, a password stays off the command line.
    #[arg(
        long,
        env = "INFERA_KVD_REMOTE_URL",
        hide_env_values = true,
        help_heading = "Distributed tier (L4)"
    )]
    pub remote_url: Option<String>,
    /// First part of every L4 key (`<namespace>:<model>:<compat_key>:<key hex>`); one per
    /// fleet sharing a store.
    #[arg(
        long,
        default_value = "infera-kvd",
        help_heading = "Distributed tier (L4)"
    )]
    pub remote_namespace: String,
    /// Longest an L4 call may take; past it the lookup is a miss (counted).
    #[arg(long, default_value_t = 250, help_heading = "Distributed tier (L4)")]
    pub remote_timeout_ms: u64,
    /// After an L4 failure, how long the store is skipped (lookups miss at once).
    #[arg(long, default_value_t = 1000, help_heading = "Distributed tier (L4)")]
    pub remote_retry_ms: u64,
    /// Most bytes waiting to be written behind to L4 (more are dropped, counted).
    #[arg(long, default_value_t = 512 << 20, help_heading = "Distributed tier (L4)")]
    pub remote_queue_bytes: u64,
}

/// What `infera-kvd` does instead of serving.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the daemon's counters (as JSON) and exit.
    Stats,
}
