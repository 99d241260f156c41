//! Where worker records come from: an etcd prefix (range, then watch), the annotations
//! of Kubernetes Pods (list, then watch), a static file, or another crate feeding the
//! [`crate::workers::registry::Registry`] in-process.

pub(crate) mod etcd;
pub(crate) mod kubernetes;
pub(crate) mod static_file;

use crate::metrics::Metrics;
use infera_proto::worker::WorkerRecord;

/// Decodes a record found under `worker_id`, counting and logging what is refused.
pub(crate) fn decode_record(
    worker_id: &str,
    bytes: &[u8],
    metrics: &Metrics,
) -> Option<WorkerRecord> {
    match WorkerRecord::from_json(bytes) {
        Ok(record) if record.worker_id == worker_id => Some(record),
        Ok(record) => {
            metrics.record_rejected_record("key_mismatch");
            tracing::warn!(
                key_worker = worker_id,
                record_worker = %record.worker_id,
                "worker record refused: its worker_id differs from its key"
            );
            None
        }
        Err(e) => {
            metrics.record_rejected_record("invalid_record");
            tracing::warn!(worker = worker_id, "worker record refused: {e}");
            None
        }
    }
}
