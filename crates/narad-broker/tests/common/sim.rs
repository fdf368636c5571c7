//! What the simulations (`power_loss.rs`, `cluster_sim.rs`) share: the
//! reading half of a dispatcher, driven by hand.

use std::sync::Arc;
use std::time::Duration;

use narad_broker::dispatch::core::{Core, Item, Placed};
use narad_broker::dispatch::driver::Resolver;
use narad_wal::WalReader;

/// Places every record `core` can take from `reader`, then, when a rescan
/// is due, the skipped records it hands out (read by `rescan`), each where
/// `resolver` says. Returns the payloads of the records it rerouted.
pub fn read_and_rescan<R: Resolver>(
    core: &mut Core,
    reader: &mut WalReader,
    rescan: &mut WalReader,
    resolver: &R,
    now: Duration,
) -> Vec<bytes::Bytes> {
    let mut rerouted = Vec::new();
    while core.wants_read() {
        let Ok(Some(e)) = reader.next_entry() else { break };
        let Ok(rec) = e.decode() else { return rerouted };
        let topic: Arc<str> = rec.topic().into();
        let target = resolver.resolve(&rec, &topic);
        let payload = rec.payload.clone();
        let placed = core.place_new(Item { seq: e.seq, record: rec }, target, resolver, now);
        if matches!(placed, Placed::Rerouted(..)) {
            rerouted.push(payload);
        }
    }
    if core.rescan_due(now) {
        let mut pending = core.begin_rescan(now, resolver).into_iter().peekable();
        while let Some(&seq) = pending.peek() {
            rescan.seek(seq);
            let Some(rec) = rescan.next_entry().ok().flatten().and_then(|e| e.decode().ok()) else {
                core.unread(pending);
                break;
            };
            pending.next();
            let topic: Arc<str> = rec.topic().into();
            let target = resolver.resolve(&rec, &topic);
            let payload = rec.payload.clone();
            let placed = core.place_skipped(Item { seq, record: rec }, target, resolver, now);
            if matches!(placed, Placed::Rerouted(..)) {
                rerouted.push(payload);
            }
        }
    }
    rerouted
}
