//! Bad input to node RPC's decoders, in seconds: the checks of the
//! `node_rpc_*` fuzz targets (`fuzz/src/cluster.rs`) over their checked-in
//! corpora and seeded mutations. The long runs are `cargo +nightly fuzz
//! run node_rpc_<frame|request|reply>` (docs/DURABILITY.md, Fuzzing).

#[path = "../../../fuzz/src/cluster.rs"]
mod checks;
#[path = "../../../fuzz/src/harness.rs"]
mod harness;

use std::path::Path;

fn run(target: &str) {
    let check = checks::CHECKS
        .iter()
        .find(|(n, _)| *n == target)
        .unwrap_or_else(|| panic!("no check {target}"))
        .1;
    harness::survives_corpus_and_mutations(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz"),
        target,
        check,
    );
}

#[test]
fn node_rpc_frame_decoding_never_panics_and_round_trips() {
    run("node_rpc_frame");
}

#[test]
fn node_rpc_request_decoding_never_panics_and_round_trips() {
    run("node_rpc_request");
}

#[test]
fn node_rpc_reply_decoding_never_panics_and_round_trips() {
    run("node_rpc_reply");
}
