//! `spec.gateway.flowControl`: the gateways hold requests until a worker can start them
//! soon, higher classes first (`x-infera-priority`: critical, interactive, standard,
//! batch), and answer 429 with `Retry-After` those that cannot meet their TTFT deadline,
//! before any engine spends time on them. On by default.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A request class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PriorityClass {
    /// Sent first, never shed for another class.
    Critical,
    /// A person waiting on the answer.
    Interactive,
    /// The default.
    #[default]
    Standard,
    /// Offline work: waits, or is shed first.
    Batch,
}

impl PriorityClass {
    /// Its name on the gateway's command line and in the header.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Critical => "critical",
            Self::Interactive => "interactive",
            Self::Standard => "standard",
            Self::Batch => "batch",
        }
    }
}

/// Flow control in the gateways.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowControlSpec {
    /// Hold requests in the gateways while every worker they could go to is full (on by
    /// default). Off: every request is sent at once and queues inside the engines, as
    /// with the earlier gateway.
    #[serde(default = "on")]
    pub enabled: bool,
    /// A worker is full once this many of its requests wait for their first token (the
    /// engine's own queue count, read every `engineScrapeMs`, or a gateway's own
    /// streams, the larger). Lower holds TTFT nearer the engine's own prefill time;
    /// higher keeps engines busier between reads. 0: no bound.
    #[serde(default = "max_waiting")]
    #[schemars(range(max = 4096))]
    pub max_waiting_per_worker: u32,
    /// A worker is also full once it holds this many requests (running and waiting).
    /// 0 (the default): no bound; the engine's own batch limit applies.
    #[serde(default)]
    #[schemars(range(max = 65536))]
    pub seats_per_worker: u32,
    /// Requests one gateway holds waiting at once; past it, a newcomer displaces a
    /// waiting request of a lower class or is refused with 429.
    #[serde(default = "queue_requests")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub queue_requests: u32,
    /// MiB of request bodies one gateway holds at once, counted from each body's first
    /// byte; a body past it is refused with 429 as it arrives. Size the gateway's memory
    /// limit from it (the operations guide gives the bound).
    #[serde(default = "body_budget_mib")]
    #[schemars(range(min = 1, max = 65536))]
    pub body_budget_mib: u32,
    /// TTFT deadline of a request that states none (`x-infera-ttft-deadline-ms`), in
    /// milliseconds: a request that cannot start within it is answered 429 (503 when
    /// its role has no ready worker), and a request for a role with no ready worker
    /// waits this long for one.
    #[serde(default = "ttft_deadline_ms")]
    #[schemars(range(min = 1, max = 3_600_000))]
    pub ttft_deadline_ms: u32,
    /// Deadline of the `batch` class, in milliseconds; 0: `ttftDeadlineMs`.
    #[serde(default)]
    #[schemars(range(max = 86_400_000))]
    pub batch_deadline_ms: u32,
    /// Class of a request without `x-infera-priority`.
    #[serde(default)]
    pub default_priority: PriorityClass,
    /// How often each gateway reads every engine's `/metrics` for its queue and running
    /// counts, in milliseconds, so replicas agree on the load. 0: not read (each gateway
    /// goes by its own requests).
    #[serde(default = "engine_scrape_ms")]
    #[schemars(range(max = 60_000))]
    pub engine_scrape_ms: u32,
}

impl Default for FlowControlSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            max_waiting_per_worker: max_waiting(),
            seats_per_worker: 0,
            queue_requests: queue_requests(),
            body_budget_mib: body_budget_mib(),
            ttft_deadline_ms: ttft_deadline_ms(),
            batch_deadline_ms: 0,
            default_priority: PriorityClass::Standard,
            engine_scrape_ms: engine_scrape_ms(),
        }
    }
}

fn on() -> bool {
    true
}
fn max_waiting() -> u32 {
    8
}
fn queue_requests() -> u32 {
    1024
}
fn body_budget_mib() -> u32 {
    256
}
fn ttft_deadline_ms() -> u32 {
    10_000
}
fn engine_scrape_ms() -> u32 {
    500
}

impl FlowControlSpec {
    /// The gateway's `--flow-*` flags; none when off (the gateway's default).
    pub fn gateway_flags(&self) -> Vec<String> {
        if !self.enabled {
            return Vec::new();
        }
        let pairs: [(&str, String); 9] = [
            ("--flow-control", "true".into()),
            (
                "--flow-max-waiting-per-worker",
                self.max_waiting_per_worker.to_string(),
            ),
            ("--flow-seats-per-worker", self.seats_per_worker.to_string()),
            ("--flow-queue-requests", self.queue_requests.to_string()),
            (
                "--flow-body-bytes",
                (u64::from(self.body_budget_mib) << 20).to_string(),
            ),
            ("--flow-ttft-deadline-ms", self.ttft_deadline_ms.to_string()),
            (
                "--flow-batch-deadline-ms",
                self.batch_deadline_ms.to_string(),
            ),
            (
                "--flow-default-priority",
                self.default_priority.as_str().into(),
            ),
            ("--flow-engine-scrape-ms", self.engine_scrape_ms.to_string()),
        ];
        pairs
            .into_iter()
            .flat_map(|(k, v)| [k.to_owned(), v])
            .collect()
    }
}
