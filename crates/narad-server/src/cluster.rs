//! What the HTTP API shows of the control plane: narad-node's
//! [`ClusterView`] (the server holds it; `None` on a single node), the
//! JSON of `GET /v1/cluster/status` ([`ClusterStatus`]), and partition
//! figures asked of their owners ([`with_owner_figures`]), re-exported
//! for the routes.

pub use narad_node::view::{
    BoxFuture, ClusterMode, ClusterRole, ClusterStatus, ClusterView, OWNER_STATS_IN_FLIGHT,
    with_owner_figures,
};
