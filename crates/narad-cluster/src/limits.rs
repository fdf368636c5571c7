//! Every bound and timing of the node RPC transport (SPEC §7.4), in one
//! place; relations between them are `const` assertions.

use std::time::Duration;

/// Bytes of an `NRS1` frame header.
pub const FRAME_HEADER_LEN: usize = 20;
/// The largest frame payload, checked on write and before allocating on read.
pub const FRAME_MAX_PAYLOAD: usize = 16 << 20;
/// Bytes of the Auth frame's payload: an HMAC-SHA256 tag.
pub const AUTH_TAG_LEN: usize = 32;

/// A dial (QUIC handshake included) gives up after this.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(1);
/// A connection with no traffic (keep-alives included) this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Keep-alive interval of an open connection.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Reply timeout of an op that does not name its own.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
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
/// How long a server waits for a new stream's Auth frame.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(5);
/// At most one `cluster stream rejected` warning per this interval (the
/// rest are counted and reported with the next one).
pub const AUTH_WARN_INTERVAL: Duration = Duration::from_secs(10);

/// Pooled streams of each data lane (produce, consume, ack).
pub const DATA_LANE_STREAMS: usize = 16;
/// Pooled streams of the control lane.
pub const CONTROL_LANE_STREAMS: usize = 4;
/// Bidirectional streams a peer may hold open on one connection.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 64;
/// Requests of one stream a server runs at once; the stream is not read
/// further until one finishes.
pub const MAX_IN_FLIGHT_PER_STREAM: usize = 256;

const _: () = {
    assert!(FRAME_MAX_PAYLOAD <= u32::MAX as usize);
    assert!(AUTH_TAG_LEN <= FRAME_MAX_PAYLOAD);
    assert!(KEEP_ALIVE_INTERVAL.as_millis() < IDLE_TIMEOUT.as_millis());
    assert!(DIAL_TIMEOUT.as_millis() < REPLY_TIMEOUT.as_millis());
    assert!(REPLY_TIMEOUT.as_millis() <= COMMIT_TIMEOUT.as_millis());
    assert!((3 * DATA_LANE_STREAMS + CONTROL_LANE_STREAMS) as u32 <= MAX_STREAMS_PER_CONNECTION);
    assert!(AUTH_TIMEOUT.as_millis() <= REPLY_TIMEOUT.as_millis());
};
