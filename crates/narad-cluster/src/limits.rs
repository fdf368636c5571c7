//! Every bound and timing of the node RPC transport (SPEC §7.4) and of
//! membership (SPEC §7.2), in one place; relations between them are `const`
//! assertions.

use std::time::Duration;

/// Bytes of an `NRS1` frame header.
pub const FRAME_HEADER_LEN: usize = 20;
/// The largest frame payload, checked on write and before allocating on read.
pub const FRAME_MAX_PAYLOAD: usize = 16 << 20;
/// The shortest cluster secret a node starts with.
pub const MIN_SECRET_CHARS: usize = 32;

/// A dial (QUIC handshake included) gives up after this.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(1);
/// A connection with no traffic (keep-alives included) this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Keep-alive interval of an open connection.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Reply timeout of an op that does not name its own.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// After a request to a peer times out, a Ping must come back within this
/// or the connection is closed and the next request dials again: a peer
/// that was killed and restarted on the same address cannot reset the old
/// connection (its new endpoint does not know it), which would otherwise
/// look healthy until the idle timeout.
pub const LIVENESS_PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// A watched call ([`crate::Peer::call_watched`]) pings its peer this
/// often while it waits for the reply.
pub const WATCH_PING_EVERY: Duration = Duration::from_secs(1);
/// A cancellable request (a consume's long poll) whose requester has
/// pinged its connection since the request started, then sent nothing at
/// all for this long, is stopped: the requester watches its calls (a ping
/// every [`WATCH_PING_EVERY`]), so this silence means it was killed or cut
/// off, and the poll would lease records for nobody until QUIC's
/// [`IDLE_TIMEOUT`] closed the connection.
pub const REQUESTER_SILENT_AFTER: Duration = Duration::from_secs(4);
/// How long a CancelRequest (op 38) waits for its answer (sent in the
/// background; nothing waits on it).
pub const CANCEL_TIMEOUT: Duration = Duration::from_secs(2);
/// Reply timeout of CommitProduce / CommitProduceBatch.
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(30);
/// Reply timeout of a CreateTopic forwarded to the leader.
pub const CREATE_FORWARD_TIMEOUT: Duration = Duration::from_secs(75);
/// Reply timeout of a DeleteTopic forwarded to the leader.
pub const DELETE_FORWARD_TIMEOUT: Duration = Duration::from_secs(30);
/// Reply timeout of a PurgeTopic (15 s of work + 2 s of slack).
pub const PURGE_TIMEOUT: Duration = Duration::from_secs(17);
/// Slack added to a forwarded long-poll's own wait.
pub const LONG_POLL_SLACK: Duration = Duration::from_secs(2);
/// The owner clamps a consume's wait to this.
pub const CONSUME_MAX_WAIT: Duration = Duration::from_secs(30);
/// A server closes a connection whose QUIC handshake and authentication
/// (`handshake.rs`) have not both finished this long after its first packet.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(5);
/// A dialling node gives up on a peer whose authentication exchange has not
/// finished this long after the QUIC handshake.
pub const CLIENT_AUTH_TIMEOUT: Duration = Duration::from_secs(1);
/// At most one `cluster connection rejected` warning per this interval
/// (the rest are counted and reported with the next one).
pub const AUTH_WARN_INTERVAL: Duration = Duration::from_secs(10);
/// Connections not yet authenticated (handshaking, or in the
/// authentication exchange) from one source address at once; more are
/// refused in the QUIC handshake.
pub const MAX_UNAUTHENTICATED_PER_SOURCE: usize = 8;
/// Connections not yet authenticated, from all sources, at once.
pub const MAX_UNAUTHENTICATED: usize = 64;
/// Above this many connections not yet authenticated, a source whose
/// address QUIC has not validated gets a Retry first (a spoofed source
/// never answers it).
pub const RETRY_ABOVE_UNAUTHENTICATED: usize = MAX_UNAUTHENTICATED / 4;
/// Failed proofs a source may make before it is refused (a bucket that
/// refills one failure per [`AUTH_FAILURE_REFILL`]).
pub const AUTH_FAILURE_BURST: u32 = 10;
/// One failed proof is forgiven this often.
pub const AUTH_FAILURE_REFILL: Duration = Duration::from_secs(6);
/// Sources whose failure budget is tracked at once (the oldest full
/// budgets are forgotten first).
pub const AUTH_SOURCES_TRACKED: usize = 4096;
/// The connection-level receive window before the peer has authenticated:
/// what an unauthenticated peer can make this node buffer, over every
/// stream (the handshake needs at most 171 bytes).
pub const PRE_AUTH_RECEIVE_WINDOW: u32 = 4096;

/// Pooled streams of each data lane (produce, consume, ack).
pub const DATA_LANE_STREAMS: usize = 16;
/// Pooled streams of the control lane.
pub const CONTROL_LANE_STREAMS: usize = 4;
/// Bidirectional streams a peer may hold open on one connection.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 64;
/// Requests of one stream a server runs at once; the stream is not read
/// further until one finishes.
pub const MAX_IN_FLIGHT_PER_STREAM: usize = 256;

/// Every node upserts itself (MemberJoin, alive, `last_heartbeat` = now)
/// this often, starting at once.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);
/// The leader's controller ticks this often (the first tick one interval
/// after start).
pub const CONTROLLER_INTERVAL: Duration = Duration::from_secs(10);
/// An alive member whose last heartbeat is more than this old (whole
/// seconds, by the leader's wall clock) is marked dead. Defined beside the
/// placement that shares it (a create leaves such a member out of its ring
/// at once).
pub use narad_meta::limits::MEMBER_DEAD_AFTER;
/// At most one warning per failing membership activity (heartbeat,
/// controller) per this interval; the ones in between are counted and
/// reported with the next.
pub const MEMBERSHIP_WARN_INTERVAL: Duration = Duration::from_secs(30);

const _: () = {
    assert!(FRAME_MAX_PAYLOAD <= u32::MAX as usize);
    assert!(MAX_UNAUTHENTICATED_PER_SOURCE <= MAX_UNAUTHENTICATED);
    assert!(CLIENT_AUTH_TIMEOUT.as_millis() < AUTH_TIMEOUT.as_millis());
    assert!(KEEP_ALIVE_INTERVAL.as_millis() < IDLE_TIMEOUT.as_millis());
    // Several watch pings fit in the silence that stops a poll, and the
    // silence is noticed well before the idle timeout would.
    assert!(3 * WATCH_PING_EVERY.as_millis() < REQUESTER_SILENT_AFTER.as_millis());
    assert!(REQUESTER_SILENT_AFTER.as_millis() < IDLE_TIMEOUT.as_millis());
    assert!(DIAL_TIMEOUT.as_millis() < REPLY_TIMEOUT.as_millis());
    assert!(REPLY_TIMEOUT.as_millis() <= COMMIT_TIMEOUT.as_millis());
    assert!((3 * DATA_LANE_STREAMS + CONTROL_LANE_STREAMS) as u32 <= MAX_STREAMS_PER_CONNECTION);
    assert!(AUTH_TIMEOUT.as_millis() <= REPLY_TIMEOUT.as_millis());
    // A live node gets several heartbeats in before it could be called dead,
    // and the controller notices a death well within one timeout.
    assert!(3 * HEARTBEAT_INTERVAL.as_millis() < MEMBER_DEAD_AFTER.as_millis());
    assert!(CONTROLLER_INTERVAL.as_millis() < MEMBER_DEAD_AFTER.as_millis());
    assert!(MEMBER_DEAD_AFTER.subsec_nanos() == 0);
};
