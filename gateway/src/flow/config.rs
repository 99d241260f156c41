//! Flow control's flags (`--flow-*`), flattened into the gateway's.

use crate::flow::class::Priority;
use crate::flow::queue::Bounds;
use crate::flow::room::Limits;
use clap::Args;
use std::time::Duration;

/// A class's name for clap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ClassArg {
    /// Sent first, never shed for another class.
    Critical,
    /// A person waiting on the answer.
    Interactive,
    /// The default.
    Standard,
    /// Offline work: waits or is shed first.
    Batch,
}

impl From<ClassArg> for Priority {
    fn from(c: ClassArg) -> Self {
        match c {
            ClassArg::Critical => Priority::Critical,
            ClassArg::Interactive => Priority::Interactive,
            ClassArg::Standard => Priority::Standard,
            ClassArg::Batch => Priority::Batch,
        }
    }
}

/// Flow control: requests wait in the gateway, by class and deadline, until a worker
/// can start them soon, instead of queuing inside the engines.
#[derive(Debug, Clone, Args)]
pub struct FlowArgs {
    /// Hold requests in the gateway until a worker can start them soon, higher classes
    /// (`x-infera-priority`) first; refuse with 429 and `Retry-After` those that cannot
    /// meet their TTFT deadline, and let requests for a role with no ready worker wait
    /// for one up to their deadline. Off by default on the command line (the earlier
    /// gateway's behaviour); InferaDeployment turns it on.
    #[arg(long, env = "INFERA_FLOW_CONTROL", default_value_t = false, action = clap::ArgAction::Set)]
    pub flow_control: bool,

    /// A worker has room while fewer of its requests than this wait for their first
    /// token: this gateway's streams, or the engine's own queue
    /// (`vllm:num_requests_waiting`, `sglang:num_queue_reqs`) when read, the larger.
    /// 0: no bound.
    #[arg(long, env = "INFERA_FLOW_MAX_WAITING_PER_WORKER", default_value_t = 8)]
    pub flow_max_waiting_per_worker: u64,

    /// A worker has room while it holds fewer requests than this (this gateway's in
    /// flight, or the engine's running and waiting, the larger). 0: no bound.
    #[arg(long, env = "INFERA_FLOW_SEATS_PER_WORKER", default_value_t = 0)]
    pub flow_seats_per_worker: u64,

    /// Requests the gateway holds waiting at once; past it, a newcomer sheds a waiting
    /// request of a lower class or is refused with 429.
    #[arg(long, env = "INFERA_FLOW_QUEUE_REQUESTS", default_value_t = 1024)]
    pub flow_queue_requests: usize,

    /// Bytes of request bodies the gateway holds at once, counted from each body's first
    /// byte until its request is sent or answered; a body that would pass it is refused
    /// with 429 as it arrives. Bounds the gateway's memory under any mix of bodies.
    #[arg(long, env = "INFERA_FLOW_BODY_BYTES", default_value_t = 256 << 20)]
    pub flow_body_bytes: usize,

    /// TTFT deadline of a request that states none (`x-infera-ttft-deadline-ms`), in
    /// milliseconds from its arrival: the deployment's TTFT target. A request that can
    /// no longer meet it is answered 429 (or 503 when its role has no worker) before any
    /// worker starts it.
    #[arg(long, env = "INFERA_FLOW_TTFT_DEADLINE_MS", default_value_t = 10_000)]
    pub flow_ttft_deadline_ms: u64,

    /// Deadline of the `batch` class, in milliseconds (0: --flow-ttft-deadline-ms).
    #[arg(long, env = "INFERA_FLOW_BATCH_DEADLINE_MS", default_value_t = 0)]
    pub flow_batch_deadline_ms: u64,

    /// Class of a request without `x-infera-priority`.
    #[arg(long, env = "INFERA_FLOW_DEFAULT_PRIORITY", value_enum, default_value_t = ClassArg::Standard)]
    pub flow_default_priority: ClassArg,

    /// How often each worker's engine `/metrics` is read for its queue and running
    /// counts, in milliseconds, so every gateway replica sees the load the others put
    /// there. Counts older than three intervals are not used (each replica then goes by
    /// its own requests). 0: not read.
    #[arg(long, env = "INFERA_FLOW_ENGINE_SCRAPE_MS", default_value_t = 500)]
    pub flow_engine_scrape_ms: u64,
}

impl FlowArgs {
    /// A worker's limits.
    pub(crate) fn limits(&self) -> Limits {
        Limits {
            max_waiting: self.flow_max_waiting_per_worker,
            seats: self.flow_seats_per_worker,
            engine_fresh: self.engine_scrape().map_or(Duration::ZERO, |d| d * 3),
        }
    }

    /// The queue's bounds (its bytes are the body budget's).
    pub(crate) fn bounds(&self) -> Bounds {
        Bounds {
            requests: self.flow_queue_requests,
            bytes: self.flow_body_bytes,
        }
    }

    /// The engine scrape's interval, when on.
    pub(crate) fn engine_scrape(&self) -> Option<Duration> {
        (self.flow_engine_scrape_ms > 0).then(|| Duration::from_millis(self.flow_engine_scrape_ms))
    }

    /// The class of a request without `x-infera-priority`.
    pub(crate) fn default_class(&self) -> Priority {
        self.flow_default_priority.into()
    }

    /// A class's default deadline.
    pub(crate) fn deadline(&self, class: Priority) -> Duration {
        let ms = match class {
            Priority::Batch if self.flow_batch_deadline_ms > 0 => self.flow_batch_deadline_ms,
            _ => self.flow_ttft_deadline_ms,
        };
        Duration::from_millis(ms.max(1))
    }
}
