#![no_main]

// The node RPC checks live apart from lib.rs (see src/cluster.rs).
#[path = "../src/cluster.rs"]
mod cluster;

libfuzzer_sys::fuzz_target!(|data: &[u8]| cluster::node_rpc_request(data));
