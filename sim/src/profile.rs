//! The latency model: how long one engine step takes, from formulas fitted to a real
//! H200 (`shared/calib/README.md`). Profiles are data files in `sim/profiles/`, each
//! with its provenance, so a run can say exactly which numbers it used.
//!
//! - Decode step over a batch with contexts `C_i`:
//!   `a + b × (weight_bytes + Σ C_i × kv_bytes_per_token) / bandwidth` ms.
//! - Prefill of `new` tokens after `cached` tokens:
//!   `c0 + c1 × new + c2 × new × (cached + new / 2)` ms.
//! - A step that mixes decodes and prefill chunks reads the weights once: the decode
//!   step plus the compute terms of each chunk (`c0` is the fixed cost of a step with
//!   no decode in it).
//! - KV transfer between prefill and decode workers: `1.8 ms + bytes / bandwidth`.

use serde::{Deserialize, Serialize};

/// A fitted latency model for one model shape on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencyProfile {
    /// Profile name, e.g. `h200-llama-3.1-8b`.
    pub name: String,
    /// Where the numbers come from.
    pub provenance: String,
    /// Bytes of weights read per decode step.
    pub weight_bytes: f64,
    /// KV bytes per token (all layers).
    pub kv_bytes_per_token: u64,
    /// Memory bandwidth in bytes per millisecond.
    pub bandwidth_bytes_per_ms: f64,
    /// Decode fixed cost `a` (ms).
    pub decode_a_ms: f64,
    /// Decode bandwidth factor `b`.
    pub decode_b: f64,
    /// Prefill fixed cost `c0` (ms).
    pub prefill_c0_ms: f64,
    /// Prefill linear cost `c1` (ms per token).
    pub prefill_c1_ms_per_token: f64,
    /// Prefill attention cost `c2` (ms per token²).
    pub prefill_c2_ms_per_token2: f64,
    /// Longest sequence the simulated model accepts.
    pub max_model_len: usize,
}

/// Fixed cost of a KV transfer between prefill and decode workers (ms).
pub const KV_TRANSFER_FIXED_MS: f64 = 1.8;

/// Names of the built-in profiles.
pub const BUILTIN_PROFILES: [&str; 2] = ["h200-llama-3.1-8b", "h200-llama-3.2-1b"];

impl LatencyProfile {
    /// A built-in profile by name.
    pub fn builtin(name: &str) -> Option<Self> {
        let text = match name {
            "h200-llama-3.1-8b" | "8b" => include_str!("../profiles/h200-llama-3.1-8b.json"),
            "h200-llama-3.2-1b" | "1b" => include_str!("../profiles/h200-llama-3.2-1b.json"),
            _ => return None,
        };
        serde_json::from_str(text).ok()
    }

    /// One decode step over sequences with the given context lengths (ms).
    pub fn decode_step_ms(&self, contexts: impl IntoIterator<Item = usize>) -> f64 {
        let kv_tokens: usize = contexts.into_iter().sum();
        let bytes = self.weight_bytes + kv_tokens as f64 * self.kv_bytes_per_token as f64;
        self.decode_a_ms + self.decode_b * bytes / self.bandwidth_bytes_per_ms
    }

    /// Compute cost of prefilling `new` tokens after `cached` ones, without `c0` (ms).
    pub fn prefill_compute_ms(&self, new: usize, cached: usize) -> f64 {
        let new = new as f64;
        self.prefill_c1_ms_per_token * new
            + self.prefill_c2_ms_per_token2 * new * (cached as f64 + new / 2.0)
    }

    /// A prefill-only step of `new` tokens after `cached` ones (ms).
    pub fn prefill_ms(&self, new: usize, cached: usize) -> f64 {
        self.prefill_c0_ms + self.prefill_compute_ms(new, cached)
    }

    /// One engine step: decodes over `decode_contexts` plus prefill `chunks` of
    /// `(new, cached)` tokens (ms). Zero when there is nothing to do.
    pub fn step_ms(&self, decode_contexts: &[usize], chunks: &[(usize, usize)]) -> f64 {
        let compute: f64 = chunks
            .iter()
            .map(|&(new, cached)| self.prefill_compute_ms(new, cached))
            .sum();
        if !decode_contexts.is_empty() {
            self.decode_step_ms(decode_contexts.iter().copied()) + compute
        } else if !chunks.is_empty() {
            self.prefill_c0_ms + compute
        } else {
            0.0
        }
    }

    /// Time to move the KV of `tokens` tokens at `gbytes_per_s` (ms).
    pub fn kv_transfer_ms(&self, tokens: usize, gbytes_per_s: f64) -> f64 {
        let bytes = tokens as f64 * self.kv_bytes_per_token as f64;
        KV_TRANSFER_FIXED_MS + bytes / (gbytes_per_s * 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p8b() -> LatencyProfile {
        LatencyProfile::builtin("h200-llama-3.1-8b").unwrap()
    }

    fn within(got: f64, want: f64, tolerance: f64) -> bool {
        (got - want).abs() <= want * tolerance
    }

    #[test]
    fn builtin_profiles_load() {
        for name in BUILTIN_PROFILES {
            let p = LatencyProfile::builtin(name).unwrap();
            assert_eq!(p.name, name);
            assert!(!p.provenance.is_empty());
        }
        assert!(LatencyProfile::builtin("h100-imaginary").is_none());
    }

    #[test]
    fn prefill_matches_the_calibration_readme() {
        let p = p8b();
        // "a 4,096-token prompt costs ~119 ms cold and ~19 ms with 3,584 tokens cached"
        assert!(
            within(p.prefill_ms(4096, 0), 119.0, 0.01),
            "{}",
            p.prefill_ms(4096, 0)
        );
        assert!(
            within(p.prefill_ms(512, 3584), 19.0, 0.03),
            "{}",
            p.prefill_ms(512, 3584)
        );
        // Cold measurements: 2048 / 8192 tokens = 59.6 / 251.5 ms (fitted points).
        assert!(within(p.prefill_ms(2048, 0), 59.6, 0.02));
        assert!(within(p.prefill_ms(8192, 0), 251.5, 0.02));
        let one_b = LatencyProfile::builtin("1b").unwrap();
        assert!(within(one_b.prefill_ms(4096, 0), 22.901, 0.001));
        assert!(within(one_b.prefill_ms(8192, 0), 49.019, 0.001));
    }

    #[test]
    fn decode_matches_measured_points_within_the_fit_error() {
        // The README's "within 11%" is rounded: B256/C1024 is 11.05% under.
        let p = p8b();
        for (batch, ctx, measured) in [
            (1, 1024, 4.722),
            (64, 1024, 7.025),
            (256, 1024, 15.343),
            (32, 4096, 8.787),
            (128, 4096, 21.736),
        ] {
            let got = p.decode_step_ms(std::iter::repeat_n(ctx, batch));
            assert!(
                within(got, measured, 0.111),
                "B{batch} C{ctx}: {got} vs {measured}"
            );
        }
    }

    #[test]
    fn mixed_steps_read_weights_once() {
        let p = p8b();
        let decode = p.decode_step_ms([1000, 2000]);
        let mixed = p.step_ms(&[1000, 2000], &[(512, 0)]);
        assert!((mixed - decode - p.prefill_compute_ms(512, 0)).abs() < 1e-9);
        assert_eq!(p.step_ms(&[], &[]), 0.0);
        assert!((p.step_ms(&[], &[(4096, 0)]) - p.prefill_ms(4096, 0)).abs() < 1e-9);
    }

    #[test]
    fn kv_transfer_time() {
        let p = p8b();
        // 4096 tokens × 128 KiB = 512 MiB at 170 GB/s ≈ 3.16 ms + 1.8 ms.
        let ms = p.kv_transfer_ms(4096, 170.0);
        assert!(within(ms, 1.8 + 536_870_912.0 / 170e6, 1e-9), "{ms}");
    }
}
