//! Which release of Infera's own parts runs inside a deployment's engine pods (the
//! engine sidecar, kvd, the node-env init container, and the simulator for `kind: sim`),
//! and the images' pull settings. An operator upgrade rolls the operator and the
//! gateways but never an engine: the engines keep the release they run until their own
//! spec changes (they roll then anyway) or `spec.platform.version` asks for another.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A release of Infera whose engine pods this operator renders, oldest first.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
pub enum PlatformVersion {
    /// Infera 0.1.0, the first release (its operator recorded no release on the
    /// engines' StatefulSets: every engine workload without the record runs it).
    #[serde(rename = "0.1.0")]
    V0_1_0,
    /// Infera 0.2.0: the operator's pull policy and pull secrets on engine pods.
    #[serde(rename = "0.2.0")]
    V0_2_0,
}

impl PlatformVersion {
    /// Every release, oldest first.
    pub const ALL: [PlatformVersion; 2] = [Self::V0_1_0, Self::V0_2_0];

    /// This operator's own release: new deployments' engines run it.
    pub const CURRENT: PlatformVersion = Self::V0_2_0;

    /// `0.1.0`, ...: also the tag of that release's images.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V0_1_0 => "0.1.0",
            Self::V0_2_0 => "0.2.0",
        }
    }

    /// The release `s` names.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// Whether engine pods of this release have what `release` introduced: every
    /// change to how engine pods are rendered is made for a new release and gated here.
    pub fn at_least(self, release: PlatformVersion) -> bool {
        self >= release
    }
}

impl std::fmt::Display for PlatformVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The release of Infera's parts the engine pods run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlatformSpec {
    /// The release whose sidecar, kvd and node-env (and simulator, for `kind: sim`) the
    /// engine pods run. Setting it to a release the engines do not run rolls them onto
    /// it (as `spec.rollout` says: new pods beside the old ones by default). Unset: the
    /// engines keep the release they run across operator upgrades, and take the
    /// operator's own when their spec changes (they roll
    /// then anyway); `status.platform` says which they run and which is available.
    pub version: PlatformVersion,
}

/// When the kubelet pulls an image (a container's `imagePullPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PullPolicy {
    /// Every time a container starts.
    Always,
    /// Only when the node does not have the image.
    IfNotPresent,
    /// Never: the image must be on the node.
    Never,
}

impl PullPolicy {
    /// The Kubernetes value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// A Secret in the deployment's namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LocalSecret {
    /// Its name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Which release the engines run, as the operator sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlatformStatus {
    /// The release of Infera's parts in the engine pods (the oldest, while roles
    /// differ).
    pub engines: String,
    /// A newer release this operator renders, when the engines run an older one: set
    /// `spec.platform.version` to it to move them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_are_ordered_named_and_current_is_the_crate_version() {
        assert_eq!(PlatformVersion::CURRENT.as_str(), env!("CARGO_PKG_VERSION"));
        assert_eq!(PlatformVersion::ALL.last(), Some(&PlatformVersion::CURRENT));
        for v in PlatformVersion::ALL {
            assert_eq!(PlatformVersion::parse(v.as_str()), Some(v));
            assert_eq!(
                serde_json::to_value(v).unwrap(),
                serde_json::json!(v.as_str())
            );
        }
        assert!(PlatformVersion::V0_2_0.at_least(PlatformVersion::V0_1_0));
        assert!(!PlatformVersion::V0_1_0.at_least(PlatformVersion::V0_2_0));
        assert_eq!(PlatformVersion::parse("9.9.9"), None);
    }
}
