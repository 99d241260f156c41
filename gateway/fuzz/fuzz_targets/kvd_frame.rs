//! Fuzzes kvd's frame parser (the msgpack map of each request on its socket): any bytes
//! an engine or a stranger sends give a request or a wire error, never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = infera_kvd::wire::parse_request(data, 1 << 20);
});
