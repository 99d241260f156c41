//! A simulated worker's shared state: what it imitates (engine, model, sizes, the PD
//! role), its tokenizer and output generator, its engine loop, injected faults. The HTTP
//! API ([`crate::api`]) serves it and the metrics ([`crate::metrics`]) render it.

use crate::engine::EngineHandle;
use crate::faults::Faults;
use crate::flavor::Flavor;
use crate::generate::OutputGenerator;
use crate::kvd_connector::KvdHandle;
use crate::pd::PdRole;
use infera_prompt::PromptCodec;
use std::sync::Arc;

/// Everything a worker's handlers share.
#[derive(Debug)]
pub struct WorkerState {
    /// Engine imitated.
    pub flavor: Flavor,
    /// Served model name.
    pub model: String,
    /// Where the tokenizer came from.
    pub tokenizer_source: String,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Longest sequence accepted.
    pub max_model_len: usize,
    /// `max_tokens` when a request gives none.
    pub default_max_tokens: usize,
    /// Prefill/decode role, if disaggregated.
    pub pd: Option<PdRole>,
    /// Tensor/data parallel sizes advertised.
    pub tp_size: u32,
    /// Data-parallel size advertised.
    pub dp_size: u32,
    /// Prompt codec.
    pub codec: Arc<PromptCodec>,
    /// Output tokens.
    pub generator: Arc<OutputGenerator>,
    /// The engine.
    pub engine: EngineHandle,
    /// Injected faults.
    pub faults: Faults,
    /// KV cache blocks.
    pub kv_blocks: usize,
    /// Step token budget.
    pub max_num_batched_tokens: usize,
    /// Most running requests.
    pub max_num_seqs: usize,
    /// The W3C `traceparent` of the last generation request, as an engine with
    /// OpenTelemetry tracing would continue it (`GET /sim/trace`).
    pub last_traceparent: std::sync::Mutex<Option<String>>,
    /// Serve vLLM's render endpoints.
    pub scale_out: bool,
    /// The KV connector to the kvd beside the engine.
    pub kvd: Option<KvdHandle>,
}
