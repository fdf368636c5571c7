//! What the simulations (`power_loss.rs`, `cluster_sim.rs`) share: the
//! reading half of a dispatcher, driven by hand.

use std::sync::Arc;
use std::time::Duration;

use narad_broker::dispatch::core::{Core, Item, Mark};
use narad_broker::dispatch::driver::Resolver;
use narad_wal::WalReader;

/// Places every record `core` can take from `reader`, then, when a rescan
/// is due, the skipped records between its bounds (read by `rescan`), each
/// where `resolver` says.
pub fn read_and_rescan<R: Resolver>(
    core: &mut Core,
    reader: &mut WalReader,
    rescan: &mut WalReader,
    resolver: &R,
    now: Duration,
) {
    while core.wants_read() {
        let Ok(Some(e)) = reader.next_entry() else { break };
        let Ok(rec) = e.decode() else { return };
        let topic: Arc<str> = rec.topic().into();
        let target = resolver.resolve(&rec, &topic);
        core.place_new(Item { seq: e.seq, record: rec }, target, resolver, now);
    }
    if core.rescan_due(now)
        && let Some((from, to)) = core.begin_rescan(now)
    {
        rescan.seek(from);
        while rescan.position() < to {
            let seq = rescan.position();
            let Ok(Some(e)) = rescan.next_entry() else { break };
            if core.mark(seq) != Some(Mark::Skipped) {
                continue;
            }
            let Ok(rec) = e.decode() else { break };
            let topic: Arc<str> = rec.topic().into();
            let target = resolver.resolve(&rec, &topic);
            core.place_skipped(Item { seq, record: rec }, target, resolver, now);
        }
    }
}
