//! Request streams of the scenarios (pure, seeded): text of an exact token length for
//! the simulator's byte tokenizer (one token per byte), shared-prefix groups, growing
//! conversations, and the oracle hit ratio a perfect router would reach.

/// A deterministic generator (xorshift64*).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Next value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponentially distributed with mean `1 / rate`.
    pub fn exp(&mut self, rate: f64) -> f64 {
        -(1.0 - self.unit()).ln() / rate
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

const WORDS: [&str; 32] = [
    "kernel",
    "tensor",
    "cache",
    "prefill",
    "decode",
    "latency",
    "router",
    "worker",
    "gradient",
    "shard",
    "pipeline",
    "token",
    "memory",
    "bandwidth",
    "node",
    "cluster",
    "expert",
    "batch",
    "stream",
    "replica",
    "schedule",
    "buffer",
    "vector",
    "matrix",
    "attention",
    "layer",
    "weight",
    "block",
    "queue",
    "signal",
    "budget",
    "quorum",
];

/// ASCII text of exactly `tokens` bytes (tokens of the simulator's byte codec).
pub fn text(rng: &mut Rng, tokens: usize) -> String {
    let mut out = String::with_capacity(tokens + 16);
    while out.len() < tokens {
        out.push_str(WORDS[(rng.next_u64() % WORDS.len() as u64) as usize]);
        out.push(' ');
    }
    out.truncate(tokens);
    out
}

/// One shared-prefix request.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixRequest {
    /// Group.
    pub group: usize,
    /// The prompt (system prompt of the group + a question).
    pub prompt: String,
}

/// `groups` x `per_group` prompts: each group's `system` tokens followed by `question`
/// tokens of its own, in a seeded random order.
pub fn shared_prefix(
    seed: u64,
    groups: usize,
    per_group: usize,
    system: usize,
    question: usize,
) -> Vec<PrefixRequest> {
    let mut rng = Rng::new(seed);
    let systems: Vec<String> = (0..groups).map(|_| text(&mut rng, system)).collect();
    let mut out = Vec::with_capacity(groups * per_group);
    for (g, sys) in systems.iter().enumerate() {
        for _ in 0..per_group {
            out.push(PrefixRequest {
                group: g,
                prompt: format!("{sys}{}", text(&mut rng, question)),
            });
        }
    }
    rng.shuffle(&mut out);
    out
}

/// The hit ratio (cached prompt tokens / prompt tokens) if every request went to a
/// worker already holding its group's prefix, in whole blocks, given the cluster's KV
/// capacity (groups whose prefixes do not fit are charged as misses).
pub fn oracle_hit_ratio(
    requests: &[PrefixRequest],
    system: usize,
    block: usize,
    capacity_tokens: usize,
) -> f64 {
    let cached_prefix = system / block * block;
    let groups = requests.iter().map(|r| r.group).max().map_or(0, |g| g + 1);
    let fitting = capacity_tokens
        .checked_div(cached_prefix)
        .map_or(groups, |n| n.min(groups));
    let mut seen = vec![false; groups];
    let (mut hit, mut total) = (0usize, 0usize);
    for r in requests {
        total += r.prompt.len();
        if seen[r.group] && r.group < fitting {
            hit += cached_prefix;
        }
        seen[r.group] = true;
    }
    if total == 0 {
        0.0
    } else {
        hit as f64 / total as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_have_exact_lengths_and_seeds_repeat() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        assert_eq!(text(&mut a, 100), text(&mut b, 100));
        assert_eq!(text(&mut a, 2048).len(), 2048);
        let reqs = shared_prefix(1, 4, 3, 64, 8);
        assert_eq!(reqs.len(), 12);
        assert!(reqs.iter().all(|r| r.prompt.len() == 72));
        let same: Vec<&PrefixRequest> = reqs.iter().filter(|r| r.group == 2).collect();
        assert_eq!(same.len(), 3);
        assert_eq!(same[0].prompt[..64], same[1].prompt[..64]);
        assert_eq!(reqs, shared_prefix(1, 4, 3, 64, 8));
    }

    #[test]
    fn oracle_counts_every_repeat_of_a_fitting_prefix() {
        let reqs = shared_prefix(1, 4, 4, 64, 16);
        // 3 of 4 requests per group hit 64 of 80 tokens.
        let r = oracle_hit_ratio(&reqs, 64, 16, 1 << 20);
        assert!((r - 0.75 * 64.0 / 80.0).abs() < 1e-9, "{r}");
        // Room for two groups' prefixes only.
        let r = oracle_hit_ratio(&reqs, 64, 16, 128);
        assert!((r - 0.5 * 0.75 * 64.0 / 80.0).abs() < 1e-9, "{r}");
    }
}
