//! Fan-out link changes and lag across nodes: the node changing a link
//! asks each other owner of the parent's partitions over node RPC (ops 17,
//! 34, 35; see [`narad_broker::fanout::peers`]), and answers those
//! questions for its own partitions.

use std::sync::Arc;

use narad_broker::Broker;
use narad_broker::fanout::peers::{LinkPeers, NewLink, PeerFuture, PeerLag};
use narad_cluster::Transport;
use narad_cluster::rpc::{self, Reply, Request};
use narad_meta::MetaStore;

use crate::forward;

/// Reaches the other owners of a parent's partitions.
#[derive(Debug)]
pub struct RemoteLinks {
    meta: Arc<MetaStore>,
    transport: Arc<Transport>,
}

impl RemoteLinks {
    /// Peers of `meta`'s members through `transport`.
    pub fn new(meta: Arc<MetaStore>, transport: Arc<Transport>) -> Self {
        RemoteLinks { meta, transport }
    }

    /// `request` to `member`: its reply when `status` is what it answered.
    fn ask(&self, member: &str, request: Request, status: u16) -> PeerFuture<Reply> {
        let (meta, transport, member) =
            (self.meta.clone(), self.transport.clone(), member.to_owned());
        Box::pin(async move {
            let addr = crate::cluster_node::member_addr(&meta, &member)?;
            let peer = transport.peer(addr, narad_cluster::tls::DEFAULT_SERVER_NAME);
            let reply = peer.call(&request).await.map_err(|e| format!("{member}: {e}"))?;
            if reply.status != status {
                return Err(format!(
                    "{member} answered {}: {}",
                    reply.status,
                    String::from_utf8_lossy(&reply.body)
                ));
            }
            Ok(reply)
        })
    }
}

/// The body of an AnchorFanoutLink answer.
#[derive(serde::Serialize, serde::Deserialize)]
struct Anchored {
    anchored: Vec<u32>,
}

impl LinkPeers for RemoteLinks {
    fn anchor(&self, member: &str, link: &NewLink, partitions: &[u32]) -> PeerFuture<Vec<u32>> {
        let request = Request::AnchorFanoutLink(rpc::AnchorFanoutLink {
            parent: link.parent.clone(),
            incarnation: link.incarnation,
            child: link.child.clone(),
            epoch: link.epoch,
            partitions: partitions.to_vec(),
        });
        let reply = self.ask(member, request, 200);
        let member = member.to_owned();
        Box::pin(async move {
            let body = reply.await?.body;
            let a: Anchored = serde_json::from_slice(&body)
                .map_err(|e| format!("{member} answered an unreadable anchor: {e}"))?;
            Ok(a.anchored)
        })
    }

    fn settle(&self, member: &str, applied_index: u64) -> PeerFuture<()> {
        let reply = self.ask(member, Request::SettleFanoutLinks(applied_index), 204);
        Box::pin(async move { reply.await.map(|_| ()) })
    }

    fn lag(&self, member: &str, parent: &str, incarnation: u64) -> PeerFuture<PeerLag> {
        let request = Request::FanoutCursors(rpc::FanoutCursorsRequest {
            topic: parent.to_owned(),
            incarnation: std::num::NonZeroU64::new(incarnation),
        });
        let reply = self.ask(member, request, 200);
        let member = member.to_owned();
        Box::pin(async move {
            let body = reply.await?.body;
            serde_json::from_slice(&body)
                .map_err(|e| format!("{member} answered unreadable fan-out figures: {e}"))
        })
    }
}

/// FanoutCursors (17) from another node: this node's figures of the
/// parent's children over the partitions whose cursors run here (404 when
/// it holds another incarnation or none).
pub(crate) async fn lag_for_peer(broker: &Broker, r: rpc::FanoutCursorsRequest) -> Reply {
    let incarnation = match r.incarnation {
        Some(id) => id.get(),
        None => match broker.topic(&r.topic) {
            Ok(t) => t.incarnation(),
            Err(e) => return forward::reply_of(e.into()),
        },
    };
    match broker.fanout_lag_for_peer(&r.topic, incarnation).await {
        Ok(lag) => json_reply(&lag),
        Err(e) => forward::reply_of(e.into()),
    }
}

/// AnchorFanoutLink (34) from another node.
pub(crate) async fn anchor_for_peer(broker: &Broker, a: rpc::AnchorFanoutLink) -> Reply {
    let link =
        NewLink { parent: a.parent, incarnation: a.incarnation, child: a.child, epoch: a.epoch };
    match broker.anchor_link_for_peer(link, a.partitions).await {
        Ok(anchored) => json_reply(&Anchored { anchored }),
        Err(e) => forward::reply_of(e.into()),
    }
}

/// SettleFanoutLinks (35) from another node.
pub(crate) async fn settle_for_peer(broker: &Broker, applied_index: u64) -> Reply {
    match broker.settle_links_for_peer(applied_index).await {
        Ok(()) => Reply { status: 204, content_type: String::new(), body: Default::default() },
        Err(e) => forward::reply_of(e.into()),
    }
}

fn json_reply<T: serde::Serialize>(v: &T) -> Reply {
    match serde_json::to_vec(v) {
        Ok(body) => Reply::json(200, body),
        Err(e) => Reply::error(500, &format!("encode fan-out figures: {e}")),
    }
}
