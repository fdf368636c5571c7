//! The owner's answer to a peer's commit (CommitProduceBatch, op 11, and
//! CommitProduce, op 10): one type, encoded by the owner and decoded by the
//! sender, so the two sides cannot drift apart (they used to be status
//! numbers written in one crate and read, with a text match, in another).
//!
//! The wire form is unchanged from the status-number era, so releases on
//! either side of this type interoperate:
//!
//! | answer | status | body |
//! |---|---|---|
//! | [`CommitAnswer::Committed`] | 200 | `{"offsets":[..],"count":n}` |
//! | [`CommitAnswer::IncarnationMismatch`] | 412 | `{"error":..}` |
//! | [`CommitAnswer::NoTopic`] | 404 | `{"error":..}` |
//! | [`CommitAnswer::NotOwner`] | 421 | `{"error":..}` |
//! | [`CommitAnswer::IdsRefused`] | 400 | `{"error":"... trailing bytes ..."}` (an owner from before incarnations) |
//! | [`CommitAnswer::BadRequest`] | 400 | `{"error":..}` (any other 400) |
//! | [`CommitAnswer::Unavailable`] | 503 | `{"error":..}` |
//! | [`CommitAnswer::Frozen`] | 423 | `{"error":..}` (the partition is moving; a sender from before moves reads it as a failure: it retries, then reroutes) |
//! | [`CommitAnswer::Failed`] | any other | `{"error":..}` or text |
//!
//! A 200 whose body does not parse is [`CommitAnswer::Failed`]: the sender
//! must not count records as committed on an answer it cannot read (it
//! sends them again: a duplicate, never a loss).

use serde::{Deserialize, Serialize};

use crate::rpc::Reply;

/// The text an owner from before incarnations answers to the batch's
/// trailing section (and that [`CommitAnswer::IdsRefused`] is known by).
const TRAILING_BYTES: &str = "trailing bytes";

/// What the owner of a partition answered to a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitAnswer {
    /// Durable, read back and visible at these offsets.
    Committed {
        /// Each record's offset, in the batch's order.
        offsets: Vec<u64>,
        /// How many records (the length of `offsets`).
        count: u64,
    },
    /// Another incarnation of the topic is live at the owner.
    IncarnationMismatch(String),
    /// The owner's replica holds no such topic (it lags, or a delete).
    NoTopic(String),
    /// The owner's replica says another node (or nobody yet) owns it.
    NotOwner(String),
    /// An owner from before incarnations refused the batch's incarnation
    /// section: send it again without ids.
    IdsRefused(String),
    /// Any other malformed batch (empty, mixed partitions, a partition
    /// out of range).
    BadRequest(String),
    /// The owner cannot commit now (shutting down, its storage latched):
    /// retriable.
    Unavailable(String),
    /// The partition is frozen while it moves to another member (SPEC
    /// §7.3): retriable, to the same partition (the sender resolves its
    /// owner again after a back-off; never a sibling).
    Frozen(String),
    /// The commit failed at the owner, or an answer that is none of the
    /// above (`status` as received).
    Failed {
        /// The reply's status.
        status: u16,
        /// What the owner said.
        why: String,
    },
}

#[derive(Serialize, Deserialize)]
struct CommittedBody {
    offsets: Vec<u64>,
    count: u64,
}

impl CommitAnswer {
    /// The answer for an owner refusing an incarnation section the way a
    /// release from before incarnations does (a test seam for the sender's
    /// fallback).
    pub fn ids_refused_like_an_old_owner() -> CommitAnswer {
        CommitAnswer::IdsRefused(format!("bad request: 12 {TRAILING_BYTES} after the last field"))
    }

    /// The reply that carries it.
    pub fn to_reply(&self) -> Reply {
        match self {
            CommitAnswer::Committed { offsets, count } => {
                let body = CommittedBody { offsets: offsets.clone(), count: *count };
                Reply::json(200, serde_json::to_vec(&body).unwrap_or_default())
            }
            other => Reply::error(other.status(), &other.message()),
        }
    }

    /// What `reply` answers.
    pub fn from_reply(reply: &Reply) -> CommitAnswer {
        if reply.status == 200 {
            return match serde_json::from_slice::<CommittedBody>(&reply.body) {
                Ok(b) => CommitAnswer::Committed { offsets: b.offsets, count: b.count },
                Err(e) => CommitAnswer::Failed {
                    status: 200,
                    why: format!("unreadable commit answer: {e}"),
                },
            };
        }
        let why = error_message(reply);
        match reply.status {
            412 => CommitAnswer::IncarnationMismatch(why),
            404 => CommitAnswer::NoTopic(why),
            421 => CommitAnswer::NotOwner(why),
            400 if why.contains(TRAILING_BYTES) => CommitAnswer::IdsRefused(why),
            400 => CommitAnswer::BadRequest(why),
            503 => CommitAnswer::Unavailable(why),
            423 => CommitAnswer::Frozen(why),
            status => CommitAnswer::Failed { status, why },
        }
    }

    /// What the owner said (for a commit: how many records).
    pub fn message(&self) -> String {
        match self {
            CommitAnswer::Committed { count, .. } => format!("{count} records committed"),
            CommitAnswer::IncarnationMismatch(why)
            | CommitAnswer::NoTopic(why)
            | CommitAnswer::NotOwner(why)
            | CommitAnswer::IdsRefused(why)
            | CommitAnswer::BadRequest(why)
            | CommitAnswer::Unavailable(why)
            | CommitAnswer::Frozen(why)
            | CommitAnswer::Failed { why, .. } => why.clone(),
        }
    }

    /// The status it travels with.
    pub fn status(&self) -> u16 {
        match self {
            CommitAnswer::Committed { .. } => 200,
            CommitAnswer::IncarnationMismatch(_) => 412,
            CommitAnswer::NoTopic(_) => 404,
            CommitAnswer::NotOwner(_) => 421,
            CommitAnswer::IdsRefused(_) | CommitAnswer::BadRequest(_) => 400,
            CommitAnswer::Unavailable(_) => 503,
            CommitAnswer::Frozen(_) => 423,
            CommitAnswer::Failed { status, .. } => *status,
        }
    }
}

/// The `error` field of a JSON error body, or the body as text.
fn error_message(reply: &Reply) -> String {
    #[derive(Deserialize)]
    struct ErrorBody {
        error: String,
    }
    match serde_json::from_slice::<ErrorBody>(&reply.body) {
        Ok(b) => b.error,
        Err(_) => String::from_utf8_lossy(&reply.body).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_answer() -> Vec<CommitAnswer> {
        vec![
            CommitAnswer::Committed { offsets: vec![7, 8, 9], count: 3 },
            CommitAnswer::Committed { offsets: vec![], count: 0 },
            CommitAnswer::IncarnationMismatch("records accepted for incarnation 4".into()),
            CommitAnswer::NoTopic("topic not found: t".into()),
            CommitAnswer::NotOwner("not partition owner: t/1 is owned by n2".into()),
            CommitAnswer::ids_refused_like_an_old_owner(),
            CommitAnswer::BadRequest("empty commit batch".into()),
            CommitAnswer::Unavailable("shutting down".into()),
            CommitAnswer::Frozen("partition frozen while it moves to n4".into()),
            CommitAnswer::Failed { status: 500, why: "commit failed: disk".into() },
            CommitAnswer::Failed { status: 502, why: "odd".into() },
        ]
    }

    #[test]
    fn every_answer_decodes_to_itself() {
        for a in every_answer() {
            let reply = a.to_reply();
            // Through the wire form too.
            let reply = Reply::decode(&reply.encode()).unwrap();
            assert_eq!(CommitAnswer::from_reply(&reply), a, "{reply:?}");
        }
    }

    #[test]
    fn the_wire_form_is_the_status_number_eras() {
        // What releases before this type sent and read: pinned bytes.
        let r = CommitAnswer::Committed { offsets: vec![1, 2], count: 2 }.to_reply();
        assert_eq!((r.status, &r.body[..]), (200, &br#"{"offsets":[1,2],"count":2}"#[..]));
        let r = CommitAnswer::NotOwner("x".into()).to_reply();
        assert_eq!((r.status, &r.body[..]), (421, &br#"{"error":"x"}"#[..]));
        let old = Reply::error(400, "bad request: 12 trailing bytes after the last field");
        assert!(matches!(CommitAnswer::from_reply(&old), CommitAnswer::IdsRefused(_)));
        // A 412 that merely mentions the words is not the old owner's.
        let r = Reply::error(412, "trailing bytes");
        assert!(matches!(CommitAnswer::from_reply(&r), CommitAnswer::IncarnationMismatch(_)));
    }

    #[test]
    fn an_unreadable_success_is_a_failure_not_a_commit() {
        let r = Reply::json(200, &b"{\"offsets\":"[..]);
        assert!(matches!(CommitAnswer::from_reply(&r), CommitAnswer::Failed { status: 200, .. }));
        let r = Reply { status: 503, content_type: String::new(), body: "plain text".into() };
        assert_eq!(CommitAnswer::from_reply(&r), CommitAnswer::Unavailable("plain text".into()));
    }
}
