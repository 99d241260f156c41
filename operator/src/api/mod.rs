//! The public API: `InferaDeployment` (`idep`) and `PDTopology` (`pdt`) in group
//! `infera.amd.com`, version `v1alpha1`. Field docs become the CRD descriptions that
//! `kubectl explain` prints; what the API server can check (types, enums, bounds,
//! formats, CEL rules across fields) is in the schema, and what needs more than one
//! object (a topology's transport against a deployment's engine) is in [`resolve`].

pub mod autoscaling;
pub mod common;
pub mod crd;
pub mod deployment;
pub mod flow_control;
pub mod inference_pool;
pub mod platform;
pub mod resolve;
pub mod rollout;
pub mod topology;

pub use autoscaling::*;
pub use common::*;
pub use deployment::*;
pub use flow_control::*;
pub use inference_pool::*;
pub use platform::*;
pub use rollout::*;
pub use topology::*;

/// API group.
pub const GROUP: &str = "infera.amd.com";

/// API version.
pub const VERSION: &str = "v1alpha1";
