//! The tokens a simulated request "generates": a seeded walk over the tokens of a fixed
//! text, so output reads like words in any tokenizer and the same request generates the
//! same tokens on every run.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The text output tokens are drawn from.
pub const OUTPUT_TEXT: &str = "The quick brown fox jumps over the lazy dog while simulated \
engines stream tokens at the pace a real GPU would, so routers and benchmarks see \
realistic timing without any hardware. ";

/// Draws output tokens from `vocabulary` (the tokens of [`OUTPUT_TEXT`]).
#[derive(Debug, Clone)]
pub struct OutputGenerator {
    vocabulary: Vec<u32>,
}

impl OutputGenerator {
    /// A generator over `vocabulary`; an empty one yields token 0.
    pub fn new(vocabulary: Vec<u32>) -> Self {
        Self { vocabulary }
    }

    /// `count` tokens, starting at a position chosen by `seed`.
    pub fn generate(&self, seed: u64, count: usize) -> Vec<u32> {
        if self.vocabulary.is_empty() {
            return vec![0; count];
        }
        let start =
            (xxh3_64_with_seed(&seed.to_le_bytes(), 7) % self.vocabulary.len() as u64) as usize;
        (0..count)
            .map(|i| self.vocabulary[(start + i) % self.vocabulary.len()])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_and_repeatable() {
        let g = OutputGenerator::new((10..60).collect());
        assert_eq!(g.generate(1, 20), g.generate(1, 20));
        assert_ne!(g.generate(1, 20), g.generate(2, 20));
        assert_eq!(g.generate(3, 100).len(), 100);
        assert_eq!(OutputGenerator::new(Vec::new()).generate(1, 2), vec![0, 0]);
    }
}
