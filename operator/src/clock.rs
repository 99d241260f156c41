//! The time the operator writes into status (conditions, the autoscaler's looks and
//! scales): now, to the whole second. `metav1.Time` is serialized to the second, so a
//! time kept to the second compares equal to the one the API server gives back.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Now, to the second.
pub(crate) fn now() -> Time {
    let ts = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(ts.as_second()).unwrap_or(ts))
}
