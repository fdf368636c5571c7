#![no_main]

// The cluster checks live apart from lib.rs (see src/cluster.rs); each
// target uses one of them.
#[path = "../src/cluster.rs"]
#[allow(dead_code)]
mod cluster;

libfuzzer_sys::fuzz_target!(|data: &[u8]| cluster::node_rpc_handshake(data));
