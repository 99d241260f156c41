//! The tokens a simulated request "generates": a walk over the distinct tokens of a
//! fixed text, so output reads like words in any tokenizer. Each token is the one after
//! the token before it (the prompt's last token included), so output is a function of
//! the prompt and the position, and a prompt extended by part of an output continues
//! that output exactly (what a moved generation needs). A prompt ending in a token
//! outside the text starts at a place chosen by its hash; a request's own `seed` picks
//! the start instead.

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
    /// A generator over the distinct tokens of `vocabulary` (in first-seen order); an
    /// empty one yields token 0.
    pub fn new(vocabulary: Vec<u32>) -> Self {
        let mut seen = std::collections::HashSet::new();
        let vocabulary = vocabulary.into_iter().filter(|t| seen.insert(*t)).collect();
        Self { vocabulary }
    }

    /// `count` tokens following `prompt`: from the token after its last one, or (a
    /// last token outside the vocabulary, or a `seed`) from a hashed start.
    pub fn continue_prompt(&self, prompt: &[u32], seed: Option<u64>, count: usize) -> Vec<u32> {
        let n = self.vocabulary.len();
        let after_last = prompt
            .last()
            .and_then(|last| self.vocabulary.iter().position(|t| t == last))
            .map(|p| (p + 1) % n.max(1));
        match (seed, after_last) {
            (None, Some(start)) => self.walk(start, count),
            (Some(seed), _) => self.generate(seed, count),
            (None, None) => {
                let bytes: Vec<u8> = prompt.iter().flat_map(|t| t.to_le_bytes()).collect();
                self.generate(xxhash_rust::xxh3::xxh3_64(&bytes), count)
            }
        }
    }

    fn walk(&self, start: usize, count: usize) -> Vec<u32> {
        if self.vocabulary.is_empty() {
            return vec![0; count];
        }
        (0..count)
            .map(|i| self.vocabulary[(start + i) % self.vocabulary.len()])
            .collect()
    }

    /// `count` tokens, starting at a position chosen by `seed`.
    pub fn generate(&self, seed: u64, count: usize) -> Vec<u32> {
        if self.vocabulary.is_empty() {
            return vec![0; count];
        }
        let start =
            (xxh3_64_with_seed(&seed.to_le_bytes(), 7) % self.vocabulary.len() as u64) as usize;
        self.walk(start, count)
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

    #[test]
    fn a_prompt_extended_by_its_output_continues_it() {
        let g = OutputGenerator::new(vec![5, 6, 5, 7, 8, 9]);
        for prompt in [vec![1, 2, 3], vec![1, 6], vec![9]] {
            let whole = g.continue_prompt(&prompt, None, 9);
            for k in 1..9 {
                let mut extended = prompt.clone();
                extended.extend_from_slice(&whole[..k]);
                assert_eq!(
                    g.continue_prompt(&extended, None, 9 - k),
                    whole[k..],
                    "{prompt:?} at {k}"
                );
            }
        }
        // After a vocabulary token: its successor (duplicates dropped: 5 6 7 8 9).
        assert_eq!(g.continue_prompt(&[6], None, 3), vec![7, 8, 9]);
        assert_eq!(g.continue_prompt(&[9], None, 2), vec![5, 6]);
        // A seed picks the start whatever the prompt.
        assert_eq!(g.continue_prompt(&[6], Some(4), 3), g.generate(4, 3));
    }
}
