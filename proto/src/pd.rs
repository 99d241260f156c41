//! Prefill/decode connector protocols: the `disagg_meta.protocol` names a worker
//! registers, and how each one sequences its two legs.

use std::fmt;
use std::str::FromStr;

/// A prefill/decode connector protocol (the `disagg_meta.protocol` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PdProtocol {
    /// SGLang with mooncake or mori transfer.
    SglangBootstrap,
    /// vLLM `MooncakeConnector`.
    VllmMooncake,
    /// vLLM `MoRIIOConnector`, write mode.
    VllmMoriWrite,
    /// vLLM `MoRIIOConnector`, read mode.
    VllmMoriRead,
    /// ATOM mooncake (pull).
    AtomMooncake,
}

/// How the two legs of a protocol are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PdTopology {
    /// Both legs are sent at once; the engines hand the KV over between themselves.
    Concurrent,
    /// The prefill answers first; its `kv_transfer_params` go into the decode leg.
    Serial,
}

impl PdProtocol {
    /// Every protocol.
    pub const ALL: [PdProtocol; 5] = [
        Self::SglangBootstrap,
        Self::VllmMooncake,
        Self::VllmMoriWrite,
        Self::VllmMoriRead,
        Self::AtomMooncake,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SglangBootstrap => "sglang-bootstrap",
            Self::VllmMooncake => "vllm-mooncake",
            Self::VllmMoriWrite => "vllm-mori-write",
            Self::VllmMoriRead => "vllm-mori-read",
            Self::AtomMooncake => "atom-mooncake",
        }
    }

    /// The order of the legs.
    pub fn topology(self) -> PdTopology {
        match self {
            Self::SglangBootstrap | Self::VllmMooncake | Self::VllmMoriWrite => {
                PdTopology::Concurrent
            }
            Self::VllmMoriRead | Self::AtomMooncake => PdTopology::Serial,
        }
    }

    /// The engine that speaks this protocol.
    pub fn engine(self) -> crate::worker::EngineKind {
        use crate::worker::EngineKind;
        match self {
            Self::SglangBootstrap => EngineKind::Sglang,
            Self::VllmMooncake | Self::VllmMoriWrite | Self::VllmMoriRead => EngineKind::Vllm,
            Self::AtomMooncake => EngineKind::Atom,
        }
    }

    /// Whether the engines accept only `/v1/completions` in this mode (ATOM threads
    /// `kv_transfer_params` through the text-completion path only).
    pub fn completions_only(self) -> bool {
        self == Self::AtomMooncake
    }
}

impl fmt::Display for PdProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PdProtocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown prefill/decode protocol {s:?} (supported: {})",
                    Self::ALL.map(Self::as_str).join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_topologies() {
        for p in PdProtocol::ALL {
            assert_eq!(p.as_str().parse::<PdProtocol>().unwrap(), p);
        }
        let err = "vllm-nixl".parse::<PdProtocol>().unwrap_err();
        assert!(err.contains("supported: sglang-bootstrap"), "{err}");
        assert_eq!(PdProtocol::VllmMoriRead.topology(), PdTopology::Serial);
        assert_eq!(PdProtocol::VllmMoriWrite.topology(), PdTopology::Concurrent);
        assert!(PdProtocol::AtomMooncake.completions_only());
    }
}
