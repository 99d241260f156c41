//! Reading signals out of Prometheus text exposition (pure): an engine's queue, running
//! requests and KV usage under vLLM's or SGLang's names, and the gateway's TTFT,
//! inter-token and prefill-leg histograms, whose per-interval percentiles come from the
//! difference of two scrapes.
//!
//! The text format is read with `infera_proto::prom_text` (the gateway's flow control
//! reads engines' queues with it too).

pub use infera_proto::prom_text::{EngineLoad, engine_load};
use infera_proto::prom_text::{label, sample};
use std::collections::BTreeMap;

/// Cumulative histogram buckets: (upper bound, count), in the order exposed.
pub type Buckets = Vec<(f64, f64)>;

/// A gateway's latency histograms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GatewayLatency {
    /// `infera_gateway_ttft_seconds`.
    pub ttft: Buckets,
    /// `infera_gateway_itl_seconds`.
    pub itl: Buckets,
    /// `infera_request_duration_seconds` over every outcome: its `+Inf` bucket counts
    /// the requests answered, streamed or not.
    pub requests: Buckets,
    /// `infera_pd_dispatch_duration_seconds{leg="prefill"}` per worker: how long each
    /// prefill leg took, queue included. Kept per worker because a worker's series
    /// leaves with it, which a sum would read as a restart.
    pub prefill: BTreeMap<String, Buckets>,
    /// `infera_flow_queued_requests` per role (`mixed`, `prefill`, `decode`): requests
    /// flow control holds in the gateway, which no engine's queue counts.
    pub queued: BTreeMap<String, f64>,
}

/// The `_bucket` series of histogram `name` whose labels `keep` (given the label
/// text), summed by `group` (given the label text) and bound.
fn grouped_buckets(
    text: &str,
    name: &str,
    keep: impl Fn(&str) -> bool,
    group: impl Fn(&str) -> String,
) -> BTreeMap<String, Buckets> {
    let series = format!("{name}_bucket");
    let mut out: BTreeMap<String, Buckets> = BTreeMap::new();
    for (n, labels, value) in text.lines().filter_map(sample) {
        if n != series || !keep(labels) {
            continue;
        }
        let Some(le) = label(labels, "le").and_then(|le| match le {
            "+Inf" => Some(f64::INFINITY),
            v => v.parse::<f64>().ok(),
        }) else {
            continue;
        };
        let into = out.entry(group(labels)).or_default();
        match into.iter_mut().find(|(b, _)| *b == le) {
            Some((_, count)) => *count += value,
            None => into.push((le, value)),
        }
    }
    for b in out.values_mut() {
        b.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// The `_bucket` series of histogram `name`, summed over other labels, by bound.
fn buckets(text: &str, name: &str) -> Buckets {
    grouped_buckets(text, name, |_| true, |_| String::new())
        .into_values()
        .next()
        .unwrap_or_default()
}

/// A gateway's TTFT, inter-token and prefill-leg histograms from its `/metrics`.
pub fn gateway_latency(text: &str) -> GatewayLatency {
    GatewayLatency {
        ttft: buckets(text, "infera_gateway_ttft_seconds"),
        itl: buckets(text, "infera_gateway_itl_seconds"),
        requests: buckets(text, "infera_request_duration_seconds"),
        prefill: grouped_buckets(
            text,
            "infera_pd_dispatch_duration_seconds",
            |labels| label(labels, "leg") == Some("prefill"),
            |labels| label(labels, "worker_id").unwrap_or_default().to_owned(),
        ),
        queued: queued_per_role(text),
    }
}

/// The gateway's held requests per role, over models and classes.
fn queued_per_role(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (name, labels, value) in text.lines().filter_map(sample) {
        if name == "infera_flow_queued_requests"
            && let Some(role) = label(labels, "role")
        {
            *out.entry(role.to_owned()).or_default() += value;
        }
    }
    out
}

/// What was observed between scrape `before` and `now` (all of `now` after a restart,
/// whose counts start again from zero, or without an earlier scrape).
pub fn since(now: &Buckets, before: Option<&Buckets>) -> Buckets {
    let Some(before) = before else {
        return now.clone();
    };
    let earlier = |le: f64| {
        before
            .iter()
            .find(|(b, _)| *b == le)
            .map_or(0.0, |(_, c)| *c)
    };
    if now.iter().any(|(le, c)| *c < earlier(*le)) {
        return now.clone();
    }
    now.iter().map(|(le, c)| (*le, c - earlier(*le))).collect()
}

/// Two histograms of the same bounds added (several gateways).
pub fn add(a: &Buckets, b: &Buckets) -> Buckets {
    let mut out = a.clone();
    for (le, c) in b {
        match out.iter_mut().find(|(x, _)| x == le) {
            Some((_, n)) => *n += c,
            None => out.push((*le, *c)),
        }
    }
    out.sort_by(|x, y| x.0.total_cmp(&y.0));
    out
}

/// Quantile `q` of cumulative buckets, interpolated linearly inside its bucket as
/// Prometheus' `histogram_quantile` does (the highest finite bound when it falls in
/// `+Inf`); none without observations.
pub fn quantile(q: f64, buckets: &Buckets) -> Option<f64> {
    let total = buckets.last().map(|(_, c)| *c)?;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let width = count - lower.1;
            let share = if width > 0.0 {
                (rank - lower.1) / width
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * share);
        }
        lower = (le, count);
    }
    Some(lower.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GATEWAY: &str = "# TYPE infera_gateway_ttft_seconds histogram\n\
        infera_gateway_ttft_seconds_sum 3.5\n\
        infera_gateway_ttft_seconds_count 10\n\
        infera_gateway_ttft_seconds_bucket{le=\"0.1\"} 2\n\
        infera_gateway_ttft_seconds_bucket{le=\"0.25\"} 6\n\
        infera_gateway_ttft_seconds_bucket{le=\"0.5\"} 10\n\
        infera_gateway_ttft_seconds_bucket{le=\"+Inf\"} 10\n\
        infera_gateway_itl_seconds_bucket{le=\"0.01\"} 100\n\
        infera_gateway_itl_seconds_bucket{le=\"+Inf\"} 100\n\
        infera_pd_dispatch_duration_seconds_bucket{leg=\"prefill\",worker_id=\"p-0\",le=\"0.1\"} 1\n\
        infera_pd_dispatch_duration_seconds_bucket{leg=\"prefill\",worker_id=\"p-0\",le=\"+Inf\"} 3\n\
        infera_pd_dispatch_duration_seconds_bucket{leg=\"decode\",worker_id=\"d-0\",le=\"0.1\"} 5\n\
        infera_pd_dispatch_duration_seconds_bucket{leg=\"prefill\",worker_id=\"p-1\",le=\"0.1\"} 2\n\
        infera_pd_dispatch_duration_seconds_bucket{leg=\"prefill\",worker_id=\"p-1\",le=\"+Inf\"} 2\n";

    #[test]
    fn the_gateways_held_requests_add_up_per_role() {
        let text = "infera_flow_queued_requests{class=\"batch\",model=\"m\",role=\"decode\"} 3\n\
            infera_flow_queued_requests{class=\"standard\",model=\"m\",role=\"decode\"} 2\n\
            infera_flow_queued_requests{class=\"standard\",model=\"m\",role=\"prefill\"} 0\n";
        let q = gateway_latency(text).queued;
        assert_eq!(q.get("decode"), Some(&5.0));
        assert_eq!(q.get("prefill"), Some(&0.0));
        assert_eq!(q.get("mixed"), None);
    }

    #[test]
    fn gateway_histograms_and_their_quantiles() {
        let g = gateway_latency(GATEWAY);
        assert_eq!(
            g.ttft,
            vec![(0.1, 2.0), (0.25, 6.0), (0.5, 10.0), (f64::INFINITY, 10.0)]
        );
        // Rank 9 of 10 falls in (0.25, 0.5], 3 of its 4.
        assert!((quantile(0.9, &g.ttft).unwrap() - 0.4375).abs() < 1e-9);
        assert!((quantile(0.5, &g.ttft).unwrap() - 0.2125).abs() < 1e-9);
        assert!((quantile(0.9, &g.itl).unwrap() - 0.009).abs() < 1e-12);
        // The prefill legs, per worker; the decode legs left out.
        assert_eq!(
            g.prefill,
            BTreeMap::from([
                ("p-0".to_owned(), vec![(0.1, 1.0), (f64::INFINITY, 3.0)]),
                ("p-1".to_owned(), vec![(0.1, 2.0), (f64::INFINITY, 2.0)]),
            ])
        );
        assert_eq!(quantile(0.9, &Vec::new()), None);
        // Everything past the last finite bound: that bound.
        assert_eq!(
            quantile(0.9, &vec![(1.0, 0.0), (f64::INFINITY, 4.0)]),
            Some(1.0)
        );
    }

    #[test]
    fn since_subtracts_the_earlier_scrape_and_restarts_from_zero() {
        let before = vec![(0.1, 2.0), (f64::INFINITY, 4.0)];
        let now = vec![(0.1, 3.0), (f64::INFINITY, 9.0)];
        assert_eq!(
            since(&now, Some(&before)),
            vec![(0.1, 1.0), (f64::INFINITY, 5.0)]
        );
        assert_eq!(since(&now, None), now);
        // A restarted gateway counts from zero: all of now.
        let restarted = vec![(0.1, 1.0), (f64::INFINITY, 1.0)];
        assert_eq!(since(&restarted, Some(&before)), restarted);
        assert_eq!(add(&before, &now), vec![(0.1, 5.0), (f64::INFINITY, 13.0)]);
    }

    #[test]
    fn labels_with_commas_are_read() {
        let text = "x_bucket{path=\"/a,b\",le=\"0.5\"} 7\n";
        assert_eq!(buckets(text, "x"), vec![(0.5, 7.0)]);
    }
}
