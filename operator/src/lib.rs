//! The Infera operator. [`api`] holds the custom resources (`InferaDeployment`,
//! `PDTopology`) that platform teams write and the operator, `infera up` and the chart
//! all read; [`render`] builds a deployment's children (pure); [`reconcile`] observes,
//! applies, prunes and writes status; [`leader`] elects one active replica.

pub mod api;
pub mod leader;
pub mod metrics;
pub mod reconcile;
pub mod render;
