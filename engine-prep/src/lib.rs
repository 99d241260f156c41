//! How an engine worker is launched, decided once for the sidecar (which launches it) and
//! the operator (which renders the command the sidecar reads): pure, no I/O, so the
//! operator links none of the sidecar's clients.
//!
//! - [`Launch`]: the engine, or `infera-sim` imitating one ([`infera_proto::worker::EngineKind`]
//!   is the one engine type; being simulated is the distinction on top).
//! - [`flags`]: reading an engine's flags the way the engines parse them.
//! - [`prepare`]: the program, argv and environment a worker is launched with.

pub mod flags;
pub mod prepare;

use infera_proto::worker::EngineKind;

/// What a worker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Launch {
    /// The engine itself.
    Engine(EngineKind),
    /// `infera-sim` imitating the engine (its API details, metrics, KV events and
    /// connectors).
    Sim(EngineKind),
}

impl Launch {
    /// The engine run or imitated: what the worker record names and which flags apply.
    pub fn engine(self) -> EngineKind {
        match self {
            Self::Engine(e) | Self::Sim(e) => e,
        }
    }

    /// Whether the simulator runs.
    pub fn is_sim(self) -> bool {
        matches!(self, Self::Sim(_))
    }

    /// The launcher's word for it (`vllm`, `sglang`, `atom`, `sim`), as the sidecar's
    /// first argument.
    pub fn word(self) -> &'static str {
        match self {
            Self::Engine(e) => e.as_str(),
            Self::Sim(_) => "sim",
        }
    }

    /// From the sidecar's first argument and the engine flags after it: `sim` imitates
    /// the engine its `--engine` flag names (vLLM when none, as `infera-sim` does).
    pub fn from_word(word: &str, engine_args: &[String]) -> Option<Self> {
        if word == "sim" {
            let imitated = flags::flag_value(engine_args, &["--engine"])
                .and_then(|e| e.parse().ok())
                .unwrap_or(EngineKind::Vllm);
            return Some(Self::Sim(imitated));
        }
        word.parse().ok().map(Self::Engine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn words_round_trip_and_sim_names_what_it_imitates() {
        for e in [EngineKind::Vllm, EngineKind::Sglang, EngineKind::Atom] {
            let launch = Launch::Engine(e);
            assert_eq!(Launch::from_word(launch.word(), &[]), Some(launch));
        }
        assert_eq!(
            Launch::from_word("sim", &args("--port 1 --engine sglang")),
            Some(Launch::Sim(EngineKind::Sglang))
        );
        assert_eq!(
            Launch::from_word("sim", &args("--port 1")),
            Some(Launch::Sim(EngineKind::Vllm))
        );
        assert_eq!(Launch::from_word("tgi", &[]), None);
        assert!(Launch::Sim(EngineKind::Atom).is_sim());
        assert_eq!(Launch::Sim(EngineKind::Atom).engine(), EngineKind::Atom);
    }
}
