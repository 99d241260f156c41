//! The Infera operator. [`api`] holds the custom resources (`InferaDeployment`,
//! `PDTopology`) that platform teams write and the operator, `infera up` and the chart
//! all read; the reconciler builds on it.

pub mod api;
