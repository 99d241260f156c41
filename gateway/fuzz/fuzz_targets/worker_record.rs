//! Fuzzes the worker-record reader every discovery path shares: whatever etcd, a Pod
//! annotation or a static file holds, reading it never panics, and a record read once
//! reads back the same from what it writes.

#![no_main]

use infera_proto::worker::WorkerRecord;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(record) = WorkerRecord::from_json(data) {
        let again = WorkerRecord::from_json(record.to_json().as_bytes());
        assert_eq!(again.ok(), Some(record));
    }
});
