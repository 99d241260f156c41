//! Choosing a worker among candidates, for both policies behind one [`Selector`].
//!
//! The gateway's [`Routing`] holds the policy (round-robin, random or kv-aware) and
//! the overlap weights. Per request, [`Routing::for_request`] hashes the prompt once
//! (kv-aware only, at every block size of the candidates) into a [`RequestRouting`];
//! each role (`mixed`, `prefill`, `decode`) then gets a [`Selector`] with its weight.
//! [`Selector::choose`] is the decision and does no I/O: kv-aware scores cache hits
//! against load ([`crate::route::kv_cost`]), the others rotate or draw. [`Selector::commit`]
//! records a pick: under kv-aware it charges the picked worker with the request's
//! blocks and returns the [`KvCharge`], which releases them when dropped (so a failover's
//! new pick, or the request's end, gives them back). [`Selector::select`] does both, as
//! the failover loop wants.

use crate::metrics::Metrics;
use crate::offload::off_workers;
use crate::request::validate::ApiKind;
use crate::route::kv_state::{
    KvCharge, KvRouter, RequestBlocks, block_size_of, has_multimodal_content,
};
use crate::route::rotation::{Policy, PolicyKind};
use crate::workers::registry::Target;
use infera_proto::retention::{Retention, overlap_weight_factor};
use serde_json::{Map, Value};
use std::sync::Arc;

/// How much cache overlap counts against load, per role (`--kv-*overlap-weight`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct OverlapWeights {
    /// A mixed worker's pick.
    pub mixed: f64,
    /// A prefill worker's pick.
    pub prefill: f64,
    /// A decode worker's pick.
    pub decode: f64,
}

/// The gateway's routing policy and its shared state.
#[derive(Debug)]
pub(crate) struct Routing {
    policy: Policy,
    kv: Option<Arc<KvRouter>>,
    weights: OverlapWeights,
    metrics: Arc<Metrics>,
}

/// What a request brings to routing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RoutingInput<'a> {
    /// Chat or completions (how the prompt is tokenized).
    pub kind: ApiKind,
    /// The request body.
    pub body: &'a Map<String, Value>,
    /// Its size: a large one is tokenized off the async workers.
    pub body_bytes: usize,
    /// The client's explicit retention hint (it scales the overlap weight).
    pub hint: Option<Retention>,
}

/// One request's routing: its block hashes and how far cache locality counts.
#[derive(Debug)]
pub(crate) struct RequestRouting<'r> {
    routing: &'r Routing,
    blocks: Option<RequestBlocks>,
    multimodal: bool,
    /// The overlap weight's factor: 0 for a multimodal request, else the hint's.
    factor: f64,
}

/// Chooses among candidates for one role of one request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Selector<'s> {
    request: &'s RequestRouting<'s>,
    role: &'static str,
    weight: f64,
}

/// A committed pick.
#[derive(Debug)]
pub(crate) struct Selection {
    /// Index into the options it was chosen from.
    pub index: usize,
    /// The request's blocks charged to the pick (kv-aware), released when dropped.
    pub charge: Option<KvCharge>,
}

impl Routing {
    /// Routing with `policy` (when not kv-aware, and to order failover), over `kv`'s
    /// state when kv-aware; the prefill and decode pools score with their own overlap
    /// weights (`--kv-prefill-overlap-weight`, `--kv-decode-overlap-weight`), the mixed
    /// pool with `kv`'s.
    pub(crate) fn new(
        policy: PolicyKind,
        [prefill, decode]: [f64; 2],
        kv: Option<Arc<KvRouter>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            policy: Policy::new(policy),
            weights: OverlapWeights {
                mixed: kv.as_ref().map_or(1.0, |kv| kv.weight),
                prefill,
                decode,
            },
            kv,
            metrics,
        }
    }

    /// Whether it routes kv-aware (by cache hits weighed against load).
    pub(crate) fn is_kv_aware(&self) -> bool {
        self.kv.is_some()
    }

    #[cfg(test)]
    /// The weights per role.
    pub(crate) fn weights(&self) -> OverlapWeights {
        self.weights
    }

    /// Hashes the request for the block sizes of `targets` (kv-aware only).
    pub(crate) fn for_request<'t>(
        &self,
        input: RoutingInput<'_>,
        targets: impl Iterator<Item = &'t Target>,
    ) -> RequestRouting<'_> {
        let blocks = self.kv.as_ref().map(|kv| {
            let sizes = targets.filter_map(|t| block_size_of(&t.record)).collect();
            off_workers(input.body_bytes, || {
                kv.hash_request(input.kind, input.body, &sizes)
            })
        });
        let multimodal = self.kv.is_some() && has_multimodal_content(input.body);
        RequestRouting {
            routing: self,
            blocks,
            multimodal,
            factor: if multimodal {
                0.0
            } else {
                overlap_weight_factor(input.hint)
            },
        }
    }
}

impl<'r> RequestRouting<'r> {
    /// The selector for `role` (`mixed`, `prefill` or `decode`).
    pub(crate) fn selector(&'r self, role: &'static str) -> Selector<'r> {
        let w = self.routing.weights;
        let base = match role {
            "prefill" => w.prefill,
            "decode" => w.decode,
            _ => w.mixed,
        };
        Selector {
            request: self,
            role,
            weight: base * self.factor,
        }
    }
}

impl Selector<'_> {
    /// The role it picks for.
    pub(crate) fn role(&self) -> &'static str {
        self.role
    }

    #[cfg(test)]
    /// The overlap weight it scores with.
    pub(crate) fn weight(&self) -> f64 {
        self.weight
    }

    /// Index of the chosen option; `None` for no option. Charges nothing (a multimodal
    /// request's ignored cache locality is counted).
    pub(crate) fn choose(&self, options: &[&Target]) -> Option<usize> {
        let routing = self.request.routing;
        match (&routing.kv, &self.request.blocks) {
            (Some(kv), Some(blocks)) => {
                if self.request.multimodal {
                    routing.metrics.record_cache_locality_skipped("multimodal");
                }
                kv.choose(options, blocks, self.weight)
            }
            _ => routing.policy.pick(options),
        }
    }

    /// Records the pick of `target`: its kv-aware charge (released on drop).
    pub(crate) fn commit(&self, target: &Target) -> Option<KvCharge> {
        let routing = self.request.routing;
        match (&routing.kv, &self.request.blocks) {
            (Some(kv), Some(blocks)) => kv.commit(target, blocks, self.role),
            _ => None,
        }
    }

    /// Chooses and commits at once: the charge is taken at the pick, not when the
    /// answer's headers arrive (for a non-streaming request that is its end), so
    /// concurrent requests see this one's load.
    pub(crate) fn select(&self, options: &[&Target]) -> Option<Selection> {
        let index = self.choose(options)?;
        Some(Selection {
            index,
            charge: self.commit(options[index]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GatewayConfig;
    use clap::Parser;
    use infera_prompt::PromptCodec;
    use infera_proto::worker::WorkerRecord;
    use proptest::prelude::*;
    use serde_json::json;

    fn target(id: &str, block_size: u32) -> Target {
        let record = WorkerRecord::from_json(
            json!({"worker_id": id, "url": format!("http://{id}"), "model_name": "m",
                   "engine": "vllm", "kv_block_size": block_size})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        Target {
            record: Arc::new(record),
            key: id.to_owned(),
            dp_rank: None,
        }
    }

    fn routing(policy: &str) -> (Routing, Arc<Metrics>) {
        // A weight above 1 makes a cached prefix outweigh the decayed charge of the pick
        // that cached it.
        let cfg = GatewayConfig::try_parse_from([
            "g",
            "--router-policy",
            policy,
            "--kv-overlap-weight",
            "4",
        ])
        .unwrap();
        let metrics = Arc::new(Metrics::default());
        let kv = cfg.kv_aware().then(|| {
            KvRouter::new(
                Arc::new(PromptCodec::bytes()),
                cfg.kv_overlap_weight,
                true,
                metrics.clone(),
            )
        });
        let weights = [cfg.kv_prefill_overlap_weight, cfg.kv_decode_overlap_weight];
        (
            Routing::new(cfg.policy(), weights, kv, metrics.clone()),
            metrics,
        )
    }

    fn completion(prompt: &str) -> Map<String, Value> {
        json!({"model": "m", "prompt": prompt})
            .as_object()
            .cloned()
            .unwrap()
    }

    fn input(body: &Map<String, Value>, hint: Option<Retention>) -> RoutingInput<'_> {
        RoutingInput {
            kind: ApiKind::Completions,
            body,
            body_bytes: 0,
            hint,
        }
    }

    #[test]
    fn weights_per_role_scaled_by_the_hint_and_zero_for_multimodal() {
        let (r, _) = routing("kv-aware");
        let w = r.weights();
        let body = completion("hello");
        let plain = r.for_request(input(&body, None), std::iter::empty());
        let long = r.for_request(input(&body, Some(Retention::Long)), std::iter::empty());
        let image = json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]});
        let image = image.as_object().unwrap();
        let mm = r.for_request(input(image, None), std::iter::empty());
        let table = [
            (&plain, "mixed", w.mixed * overlap_weight_factor(None)),
            (&plain, "prefill", w.prefill * overlap_weight_factor(None)),
            (&plain, "decode", w.decode * overlap_weight_factor(None)),
            (
                &long,
                "mixed",
                w.mixed * overlap_weight_factor(Some(Retention::Long)),
            ),
            (&mm, "mixed", 0.0),
            (&mm, "prefill", 0.0),
        ];
        for (request, role, want) in table {
            let s = request.selector(role);
            assert_eq!((s.role(), s.weight()), (role, want), "{role}");
        }
    }

    #[test]
    fn round_robin_rotates_and_charges_nothing() {
        let (r, _) = routing("round-robin");
        let (a, b, c) = (target("a:1", 4), target("b:1", 4), target("c:1", 4));
        let options = [&a, &b, &c];
        let body = completion("hello");
        let request = r.for_request(input(&body, None), options.iter().copied());
        let s = request.selector("mixed");
        let picks: Vec<(usize, bool)> = (0..4)
            .map(|_| {
                let sel = s.select(&options).unwrap();
                (sel.index, sel.charge.is_some())
            })
            .collect();
        assert_eq!(picks, [(0, false), (1, false), (2, false), (0, false)]);
        assert!(s.select(&[]).is_none());
    }

    #[test]
    fn kv_aware_follows_the_cached_prefix_and_releases_its_charge() {
        let (r, _) = routing("kv-aware");
        let (a, b) = (target("a:1", 4), target("b:1", 4));
        let options = [&a, &b];
        let prompt = "a shared prefix of many blocks, long enough to matter";
        let body = completion(prompt);
        let request = r.for_request(input(&body, None), options.iter().copied());
        let s = request.selector("mixed");
        // The first pick grows the picked worker's (approximate) view ...
        let first = s.select(&options).unwrap();
        let charged = r.kv.as_ref().unwrap().active_blocks();
        assert!(charged > 0, "the pick charges its blocks");
        drop(first.charge);
        assert_eq!(
            r.kv.as_ref().unwrap().active_blocks(),
            0,
            "released on drop"
        );
        // ... so the same prompt goes back to it.
        assert_eq!(s.choose(&options), Some(first.index));
        assert_eq!(s.choose(&[&b, &a]), Some(1 - first.index));
    }

    #[test]
    fn multimodal_requests_count_their_skipped_locality_per_choice() {
        let (r, metrics) = routing("kv-aware");
        let a = target("a:1", 4);
        let image = json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]});
        let image = image.as_object().unwrap();
        let request = r.for_request(
            RoutingInput {
                kind: ApiKind::Chat,
                ..input(image, None)
            },
            std::iter::once(&a),
        );
        for _ in 0..2 {
            assert_eq!(request.selector("decode").choose(&[&a]), Some(0));
        }
        let text = metrics.render(&Default::default(), None);
        assert!(
            text.contains("infera_cache_locality_skipped_total{reason=\"multimodal\"} 2"),
            "{text}"
        );
    }

    proptest! {
        #[test]
        fn select_picks_in_range_and_none_only_when_empty(
            n in 0usize..6,
            kv in any::<bool>(),
            prompt in "[a-z ]{0,40}",
            rounds in 1usize..8,
        ) {
            let (r, _) = routing(if kv { "kv-aware" } else { "round-robin" });
            let targets: Vec<Target> = (0..n).map(|i| target(&format!("w{i}:1"), 1 + i as u32 % 3)).collect();
            let options: Vec<&Target> = targets.iter().collect();
            let body = completion(&prompt);
            let request = r.for_request(input(&body, None), targets.iter());
            let mut held = Vec::new();
            for _ in 0..rounds {
                match request.selector("mixed").select(&options) {
                    Some(sel) => {
                        prop_assert!(sel.index < n);
                        held.push(sel.charge);
                    }
                    None => prop_assert_eq!(n, 0),
                }
            }
            drop(held);
            if let Some(kv) = &r.kv {
                prop_assert_eq!(kv.active_blocks(), 0, "every charge released");
            }
        }
    }
}
