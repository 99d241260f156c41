//! Reading Prometheus text exposition (pure): samples and their labels, and an
//! engine's queue, running requests and KV usage under vLLM's or SGLang's names. The
//! operator's autoscaler and the gateway's flow control read engines with it.
//!
//! A small reader of the text format rather than a crate: the one published parser
//! rejects metric names with colons, which every vLLM and SGLang metric has.

/// One engine's load.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineLoad {
    /// Requests waiting in its queue.
    pub waiting: Option<f64>,
    /// Requests running.
    pub running: Option<f64>,
    /// KV-cache usage, 0-1.
    pub kv_usage: Option<f64>,
}

/// Engine metric names: vLLM (and ATOM), then SGLang; the older vLLM KV name last.
const WAITING: [&str; 2] = ["vllm:num_requests_waiting", "sglang:num_queue_reqs"];
const RUNNING: [&str; 2] = ["vllm:num_requests_running", "sglang:num_running_reqs"];
const KV_USAGE: [&str; 3] = [
    "vllm:kv_cache_usage_perc",
    "sglang:token_usage",
    "vllm:gpu_cache_usage_perc",
];

/// A sample line split into its name, its label text (inside the braces) and its value.
pub fn sample(line: &str) -> Option<(&str, &str, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (series, rest) = match line.find('{') {
        Some(open) => {
            let close = line[open..].find('}')? + open;
            (&line[..close + 1], &line[close + 1..])
        }
        None => line.split_at(line.find(char::is_whitespace)?),
    };
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    match series.split_once('{') {
        Some((name, labels)) => Some((name, labels.trim_end_matches('}'), value)),
        None => Some((series, "", value)),
    }
}

/// The value of label `key` in a label text.
pub fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    while let Some((k, after)) = rest.split_once("=\"") {
        let end = after.find('"')?;
        if k.trim().trim_start_matches(',').trim() == key {
            return Some(&after[..end]);
        }
        rest = &after[end + 1..];
    }
    None
}

/// Every series' value of the first of `names` the text has (an engine may label one
/// series per model or per engine core).
fn first_values(text: &str, names: &[&str]) -> Option<Vec<f64>> {
    names.iter().find_map(|want| {
        let values: Vec<f64> = text
            .lines()
            .filter_map(sample)
            .filter(|(name, _, _)| name == want)
            .map(|(_, _, v)| v)
            .collect();
        (!values.is_empty()).then_some(values)
    })
}

/// An engine's load from its `/metrics`.
pub fn engine_load(text: &str) -> EngineLoad {
    EngineLoad {
        // Queues add up over engine cores; usage is a share, so their mean.
        waiting: first_values(text, &WAITING).map(|v| v.iter().sum()),
        running: first_values(text, &RUNNING).map(|v| v.iter().sum()),
        kv_usage: first_values(text, &KV_USAGE)
            .map(|v| (v.iter().sum::<f64>() / v.len() as f64).clamp(0.0, 1.0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = "# HELP vllm:num_requests_waiting Number of requests waiting.\n\
        # TYPE vllm:num_requests_waiting gauge\n\
        vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0\n\
        vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 2.0\n\
        vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 8.0\n\
        vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n\
        vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.75\n";

    const SGLANG: &str = "sglang:num_queue_reqs{model_name=\"m\"} 1\n\
        sglang:num_running_reqs{model_name=\"m\"} 4\n\
        sglang:token_usage{model_name=\"m\"} 0.5\n";

    #[test]
    fn engine_load_reads_vllm_and_sglang_names() {
        assert_eq!(
            engine_load(VLLM),
            EngineLoad {
                waiting: Some(5.0),
                running: Some(8.0),
                kv_usage: Some(0.5)
            }
        );
        assert_eq!(
            engine_load(SGLANG),
            EngineLoad {
                waiting: Some(1.0),
                running: Some(4.0),
                kv_usage: Some(0.5)
            }
        );
        assert_eq!(engine_load("# nothing\n"), EngineLoad::default());
    }
}
