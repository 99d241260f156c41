//! The Infera operator. [`api`] holds the custom resources (`InferaDeployment`,
//! `PDTopology`) that platform teams write and the operator, `infera up` and the chart
//! all read; [`plan`] validates a deployment into the plan its children are built from
//! and [`render`] builds them (both pure); [`reconcile`] observes, applies, prunes and
//! writes status; [`autoscale`] sizes the workers of deployments with
//! `spec.autoscaling`; [`leader`] elects one active replica.

pub mod api;
pub mod autoscale;
pub mod cli;
mod clock;
pub mod leader;
pub mod metrics;
pub mod names;
pub mod plan;
pub mod quantity;
pub mod reconcile;
pub mod render;
