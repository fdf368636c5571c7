//! Unit tests of the state machine: every stateful rule, incarnations, schema
//! evolution, fan-out links, assignments, members, counters and listing.

use std::sync::Arc;

use super::*;
use crate::command::{AttachChild, DeleteTopic, DetachChild};
use crate::config::TopicDefaults;
use crate::request::{AlterTopicRequest, AttachChildRequest, CreateTopicRequest};
use crate::topic::Role;

/// A state machine under test; checks every invariant after every command.
#[derive(Default)]
struct Sm {
    state: MetaState,
}

impl Sm {
    fn run(&mut self, cmd: Command) -> Result<Response, MetaError> {
        let applied = apply(&self.state, self.state.applied_index + 1, &cmd)?;
        applied.state.check_invariants().expect("invariants hold after every command");
        self.state = applied.state;
        Ok(applied.response)
    }

    /// Runs a command that must fail, and checks it changed nothing.
    fn refuse(&mut self, cmd: Command) -> MetaError {
        let before = self.state.clone();
        let err = self.run(cmd).expect_err("command must be refused");
        assert_eq!(self.state, before, "a refused command changes nothing");
        err
    }

    fn create_cmd(&self, req: CreateTopicRequest) -> Command {
        let c =
            req.resolve(&TopicDefaults::default(), &self.state, 1_700_000_000_000, 0xfeed).unwrap();
        Command::CreateTopic(c)
    }

    fn create(&mut self, req: CreateTopicRequest) -> Arc<Topic> {
        match self.run(self.create_cmd(req)).unwrap() {
            Response::Topic(t) => t,
            other => panic!("{other:?}"),
        }
    }

    fn alter_cmd(&self, name: &str, req: AlterTopicRequest) -> Command {
        Command::AlterTopic(req.resolve(name, &TopicDefaults::default()).unwrap())
    }

    fn alter(&mut self, name: &str, req: AlterTopicRequest) -> Result<Response, MetaError> {
        self.run(self.alter_cmd(name, req))
    }

    fn delete(&mut self, name: &str) -> Result<Response, MetaError> {
        self.run(Command::DeleteTopic(DeleteTopic { name: name.into() }))
    }

    fn topic(&self, name: &str) -> &Topic {
        self.state.topic(name).unwrap()
    }

    fn schema_texts(&self, name: &str) -> Vec<String> {
        let h = self.state.schema_history(name);
        h.map(|h| h.versions().iter().map(|v| v.to_string()).collect()).unwrap_or_default()
    }
}

fn req(name: &str) -> CreateTopicRequest {
    CreateTopicRequest { name: name.into(), ..Default::default() }
}

fn child_req(name: &str, parent: &str, delay: i64) -> CreateTopicRequest {
    CreateTopicRequest { parent: parent.into(), fanout_delay_ms: delay, ..req(name) }
}

fn with_schema(name: &str, schema: &str) -> CreateTopicRequest {
    CreateTopicRequest { schema: Some(schema.into()), ..req(name) }
}

fn schema_alter(schema: &str) -> AlterTopicRequest {
    AlterTopicRequest { schema: Some(schema.into()), ..Default::default() }
}

const S1: &str = r#"{"type":"object","properties":{"id":{"type":"integer"}},"required":["id"]}"#;
const S2: &str = r#"{"type":"object","properties":{"id":{"type":"integer"},"note":{"type":"string"}},"required":["id"]}"#;
const S_DROPS_ID: &str = r#"{"type":"object","properties":{"note":{"type":"string"}}}"#;

#[test]
fn a_created_topic_holds_every_option() {
    let mut sm = Sm::default();
    let t = sm.create(CreateTopicRequest { owner: "alice".into(), partitions: 5, ..req("orders") });
    assert_eq!((t.name(), t.partitions(), t.owner()), ("orders", 5, "alice"));
    assert_eq!((t.retention_ms(), t.visibility_timeout_ms()), (604_800_000, 30_000));
    assert_eq!((t.max_in_flight_per_partition(), t.max_acked_ahead_per_partition()), (1024, 1024));
    assert_eq!((t.created_at(), t.role(), t.incarnation()), (1_700_000_000, Role::Standalone, 1));
    assert_eq!(sm.state.topic("orders"), Some(&t));
}

#[test]
fn duplicate_create_is_409_topic_already_exists() {
    let mut sm = Sm::default();
    sm.create(req("t"));
    let cmd = sm.create_cmd(req("t"));
    let e = sm.refuse(cmd);
    assert_eq!((e.status(), e.to_string()), (409, "topic already exists".to_owned()));
}

#[test]
fn recreate_after_delete_gets_a_new_incarnation() {
    let mut sm = Sm::default();
    let first = sm.create(req("t"));
    sm.create(req("other"));
    match sm.delete("t").unwrap() {
        Response::TopicDeleted(t) => assert_eq!(t.incarnation(), first.incarnation()),
        other => panic!("{other:?}"),
    }
    assert!(sm.state.topic("t").is_none());
    let second = sm.create(req("t"));
    assert_ne!(second.incarnation(), first.incarnation());
    assert_ne!(second.incarnation(), sm.topic("other").incarnation());
    assert_eq!(second.incarnation(), sm.state.applied_index());
}

#[test]
fn missing_topics_are_404_topic_not_found() {
    let mut sm = Sm::default();
    let e = sm.refuse(Command::DeleteTopic(DeleteTopic { name: "nope".into() }));
    assert_eq!((e.status(), e.to_string()), (404, "topic not found".to_owned()));
    let alter = sm.alter_cmd("nope", AlterTopicRequest { partitions: 4, ..Default::default() });
    assert_eq!(sm.refuse(alter).status(), 404);
}

#[test]
fn apply_rechecks_rules_a_proposer_may_have_skipped() {
    let mut sm = Sm::default();
    let Command::CreateTopic(good) = sm.create_cmd(req("t")) else { unreachable!() };
    let bad = [
        CreateTopic { partitions: 2, ..good.clone() },
        CreateTopic { retention_ms: 1000, ..good.clone() },
        CreateTopic { name: "..".into(), ..good.clone() },
        CreateTopic { schema: Some("{".into()), ..good.clone() },
    ];
    for c in bad {
        assert_eq!(sm.refuse(Command::CreateTopic(c)).status(), 400);
    }
}

#[test]
fn alter_changes_retention_caps_and_grows_partitions() {
    let mut sm = Sm::default();
    sm.create(req("t"));
    let resp = sm
        .alter(
            "t",
            AlterTopicRequest {
                partitions: 8,
                retention_ms: Some(7_200_000),
                max_in_flight_per_partition: Some(5),
                max_acked_ahead_per_partition: Some(6),
                schema: None,
            },
        )
        .unwrap();
    let Response::Topic(t) = resp else { panic!() };
    assert_eq!((t.partitions(), t.retention_ms()), (8, 7_200_000));
    assert_eq!((t.max_in_flight_per_partition(), t.max_acked_ahead_per_partition()), (5, 6));
    assert_eq!(t.incarnation(), 1, "alter keeps the incarnation");
    assert_eq!(sm.topic("t"), &*t);
}

#[test]
fn partitions_only_grow() {
    let mut sm = Sm::default();
    sm.create(CreateTopicRequest { partitions: 5, ..req("t") });
    for n in [5, 4] {
        let cmd = sm.alter_cmd("t", AlterTopicRequest { partitions: n, ..Default::default() });
        let e = sm.refuse(cmd);
        assert_eq!(
            e.to_string(),
            format!(
                "invalid argument: new partition count ({n}) must be greater than current (5); \
                 decrease is not supported"
            )
        );
    }
}

#[test]
fn a_schema_evolves_only_compatibly() {
    let mut sm = Sm::default();
    sm.create(with_schema("t", S1));
    assert_eq!(sm.state.compiled_schema("t").unwrap().version(), 1);
    sm.alter("t", schema_alter(S2)).unwrap();
    assert_eq!(sm.schema_texts("t"), vec![S1, S2]);
    assert_eq!(sm.state.compiled_schema("t").unwrap().version(), 2);
    let e = sm.refuse(sm.alter_cmd("t", schema_alter(S_DROPS_ID)));
    assert_eq!(
        e.to_string(),
        r#"invalid argument: schema: not backward compatible with version 2: property "id" was removed"#
    );
    let e = sm.refuse(sm.alter_cmd("t", schema_alter(r#"{"type":"bogus"}"#)));
    assert!(e.to_string().starts_with("invalid argument: schema: "), "{e}");
}

#[test]
fn the_first_schema_of_a_topic_needs_no_compatibility() {
    let mut sm = Sm::default();
    sm.create(req("t"));
    sm.alter("t", schema_alter(S_DROPS_ID)).unwrap();
    assert_eq!(sm.schema_texts("t"), vec![S_DROPS_ID]);
}

#[test]
fn an_alter_applies_all_of_its_steps_or_none() {
    let mut sm = Sm::default();
    sm.create(with_schema("t", S1));
    let all = AlterTopicRequest {
        retention_ms: Some(7_200_000),
        partitions: 9,
        ..schema_alter(S_DROPS_ID)
    };
    let cmd = sm.alter_cmd("t", all);
    sm.refuse(cmd);
    assert_eq!((sm.topic("t").retention_ms(), sm.topic("t").partitions()), (604_800_000, 3));
}

#[test]
fn a_child_links_to_its_parent_and_takes_its_partition_count() {
    let mut sm = Sm::default();
    sm.create(CreateTopicRequest { partitions: 6, ..req("p") });
    let c = sm.create(child_req("c", "p", 0));
    assert_eq!((c.role(), c.partitions()), (Role::Child, 6));
    let link = c.parent().unwrap();
    assert_eq!((link.name.as_str(), link.attach_epoch.as_str()), ("p", "000000000000feed"));
    let p = sm.topic("p");
    assert_eq!((p.role(), p.children()), (Role::Parent, &["c".to_owned()][..]));
    let explicit = sm.create(CreateTopicRequest { partitions: 3, ..child_req("d", "p", 0) });
    assert_eq!(explicit.partitions(), 3);
    assert_eq!(sm.topic("p").children(), &["c".to_owned(), "d".to_owned()][..]);
}

#[test]
fn a_child_adopts_its_parents_schema_or_brings_the_same_one() {
    let mut sm = Sm::default();
    sm.create(with_schema("p", S1));
    sm.alter("p", schema_alter(S2)).unwrap();
    sm.create(child_req("adopts", "p", 0));
    assert_eq!(sm.schema_texts("adopts"), vec![S1, S2]);
    let mismatch =
        sm.create_cmd(CreateTopicRequest { schema: Some(S2.into()), ..child_req("c", "p", 0) });
    let e = sm.refuse(mismatch);
    assert_eq!(e.status(), 409);
    assert!(e.to_string().starts_with("schema mismatch"), "{e}");

    sm.create(with_schema("q", S1));
    sm.create(CreateTopicRequest { schema: Some(S1.into()), ..child_req("same", "q", 0) });
    assert_eq!(sm.schema_texts("same"), vec![S1]);
    sm.create(req("bare"));
    let e =
        sm.refuse(sm.create_cmd(CreateTopicRequest {
            schema: Some(S1.into()),
            ..child_req("x", "bare", 0)
        }));
    assert_eq!(e.status(), 409);
}

#[test]
fn fan_out_is_one_level_deep_and_bounded() {
    let mut sm = Sm::default();
    sm.create(req("p"));
    sm.create(child_req("c", "p", 0));
    let e = sm.refuse(sm.create_cmd(child_req("grandchild", "c", 0)));
    assert_eq!(e.status(), 409);
    assert_eq!(e.to_string(), r#"topic "c" is a child of "p" and cannot have children"#);
    for i in 1..108 {
        sm.create(child_req(&format!("c{i}"), "p", 0));
    }
    assert_eq!(sm.topic("p").children().len(), 108);
    let e = sm.refuse(sm.create_cmd(child_req("one-too-many", "p", 0)));
    assert_eq!(
        (e.status(), e.to_string()),
        (409, r#"parent topic "p" already has 108 children"#.into())
    );
}

#[test]
fn a_delayed_child_needs_a_parent_retention_of_delay_plus_an_hour() {
    let mut sm = Sm::default();
    sm.create(CreateTopicRequest { retention_ms: 7_200_000, ..req("p") });
    let e = sm.refuse(sm.create_cmd(child_req("c", "p", 3_600_001)));
    assert_eq!(
        e.to_string(),
        "invalid argument: parent retention_ms (7200000) must be at least fanout_delay_ms + 1 hour (7200001)"
    );
    let c = sm.create(child_req("c", "p", 3_600_000));
    assert!(c.is_delayed_child());
    let shrink = sm
        .alter_cmd("p", AlterTopicRequest { retention_ms: Some(7_199_999), ..Default::default() });
    assert_eq!(sm.refuse(shrink).status(), 400);
    sm.create(CreateTopicRequest { retention_ms: 0, ..req("forever") });
    let keep_forever =
        sm.alter_cmd("forever", AlterTopicRequest { retention_ms: Some(0), ..Default::default() });
    sm.run(keep_forever).unwrap();
}

#[test]
fn a_parent_deleted_between_resolve_and_apply_is_404() {
    let mut sm = Sm::default();
    sm.create(req("p"));
    let cmd = sm.create_cmd(child_req("c", "p", 0));
    sm.delete("p").unwrap();
    let e = sm.refuse(cmd);
    assert_eq!((e.status(), e.to_string()), (404, r#"topic not found: parent topic "p""#.into()));
}

#[test]
fn a_parent_manages_its_childrens_schema() {
    let mut sm = Sm::default();
    sm.create(with_schema("p", S1));
    sm.create(child_req("c", "p", 0));
    let e = sm.refuse(sm.alter_cmd("c", schema_alter(S2)));
    assert_eq!(e.status(), 409);
    assert_eq!(e.to_string(), r#"topic "c" is attached to parent "p", which manages its schema"#);
    sm.alter("p", schema_alter(S2)).unwrap();
    assert_eq!(sm.schema_texts("c"), vec![S1, S2]);
    assert_eq!(sm.state.compiled_schema("c").unwrap().version(), 2);
}

#[test]
fn deleting_a_parent_leaves_standalone_children_with_their_schema() {
    let mut sm = Sm::default();
    sm.create(with_schema("p", S1));
    sm.create(child_req("c", "p", 5));
    sm.delete("p").unwrap();
    let c = sm.topic("c");
    assert_eq!((c.role(), c.parent(), c.is_delayed_child()), (Role::Standalone, None, false));
    assert_eq!(sm.schema_texts("c"), vec![S1]);
    sm.alter("c", schema_alter(S2)).unwrap();
}

#[test]
fn deleting_the_last_child_makes_the_parent_standalone() {
    let mut sm = Sm::default();
    sm.create(req("p"));
    sm.create(child_req("a", "p", 0));
    sm.create(child_req("b", "p", 0));
    sm.delete("a").unwrap();
    assert_eq!(sm.topic("p").children(), &["b".to_owned()][..]);
    sm.delete("b").unwrap();
    assert_eq!(sm.topic("p").role(), Role::Standalone);
}

fn attach_cmd(parent: &str, child: &str, delay: u64, epoch: u64) -> Command {
    Command::AttachChild(AttachChild {
        parent: parent.into(),
        child: child.into(),
        attach_epoch: crate::request::format_epoch(epoch),
        fanout_delay_ms: delay,
        attached_at_ms: 1_700_000_000_000 + epoch,
    })
}

fn detach_cmd(parent: &str, child: &str) -> Command {
    Command::DetachChild(DetachChild { parent: parent.into(), child: child.into() })
}

impl Sm {
    fn attach(&mut self, parent: &str, child: &str, delay: u64, epoch: u64) -> Arc<Topic> {
        match self.run(attach_cmd(parent, child, delay, epoch)).unwrap() {
            Response::Topic(t) => t,
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn attach_links_an_existing_topic_with_its_epoch_delay_and_time() {
    let mut sm = Sm::default();
    sm.create(req("p"));
    sm.create(CreateTopicRequest { partitions: 5, ..req("c") });
    let parent = sm.attach("p", "c", 2_000, 0xab);
    assert_eq!(
        (parent.name(), parent.role(), parent.children()),
        ("p", Role::Parent, &["c".to_owned()][..])
    );
    let c = sm.topic("c");
    assert_eq!((c.role(), c.partitions(), c.is_delayed_child()), (Role::Child, 5, true));
    let link = c.parent().unwrap();
    assert_eq!(link.name, "p");
    assert_eq!(link.attach_epoch, "00000000000000ab");
    assert_eq!((link.fanout_delay_ms, link.attached_at_ms), (2_000, 1_700_000_000_000 + 0xab));
}

#[test]
fn detach_dissolves_the_link_and_a_reattach_gets_a_new_epoch() {
    let mut sm = Sm::default();
    sm.create(with_schema("p", S1));
    sm.create(req("a"));
    sm.create(req("b"));
    sm.attach("p", "a", 0, 1);
    sm.attach("p", "b", 0, 2);
    match sm.run(detach_cmd("p", "a")).unwrap() {
        Response::ChildDetached { parent, link } => {
            assert_eq!(parent.children(), &["b".to_owned()][..]);
            assert_eq!((link.name.as_str(), link.attach_epoch.as_str()), ("p", "0000000000000001"));
        }
        other => panic!("{other:?}"),
    }
    let a = sm.topic("a");
    assert_eq!((a.role(), a.parent()), (Role::Standalone, None));
    assert_eq!(sm.schema_texts("a"), vec![S1], "a detached child keeps the schema it had");
    sm.run(detach_cmd("p", "b")).unwrap();
    assert_eq!(sm.topic("p").role(), Role::Standalone, "no children left: standalone");

    sm.attach("p", "a", 0, 3);
    let link = sm.topic("a").parent().unwrap().clone();
    assert_eq!(link.attach_epoch, "0000000000000003", "each attach has its own epoch");
    sm.run(detach_cmd("p", "a")).unwrap();
    let e = sm.refuse(detach_cmd("p", "a"));
    assert_eq!((e.status(), e.to_string()), (404, r#"topic "a" is not attached to "p""#.into()));
}

#[test]
fn detach_of_a_link_that_does_not_exist_is_404() {
    let mut sm = Sm::default();
    sm.create(req("p"));
    sm.create(req("q"));
    sm.create(req("c"));
    sm.attach("q", "c", 0, 1);
    let cases = [
        (detach_cmd("nope", "c"), "topic not found"),
        (detach_cmd("p", "nope"), r#"topic not found: child topic "nope""#),
        (detach_cmd("p", "c"), r#"topic "c" is not attached to "p""#),
        (detach_cmd("p", "q"), r#"topic "q" is not attached to "p""#),
    ];
    for (cmd, text) in cases {
        let e = sm.refuse(cmd);
        assert_eq!((e.status(), e.to_string()), (404, text.to_owned()));
    }
}

#[test]
fn attach_refuses_every_broken_rule_with_its_status_and_text() {
    let mut sm = Sm::default();
    sm.create(CreateTopicRequest { retention_ms: 7_200_000, ..req("p") });
    sm.create(req("q"));
    sm.create(req("c"));
    sm.create(req("d"));
    sm.create(req("g"));
    sm.attach("p", "c", 0, 1);
    sm.attach("q", "d", 0, 2);
    let bad_epoch = Command::AttachChild(AttachChild {
        parent: "p".into(),
        child: "g".into(),
        attach_epoch: "xyz".into(),
        fanout_delay_ms: 0,
        attached_at_ms: 1,
    });
    let cases: Vec<(Command, u16, &str)> = vec![
        (attach_cmd("p", "", 0, 9), 400, "invalid argument: child required"),
        (attach_cmd("p", "p", 0, 9), 400, "invalid argument: a topic cannot be attached to itself"),
        (
            attach_cmd("p", "g", 31_536_000_001, 9),
            400,
            "invalid argument: delay_ms (31536000001) exceeds the maximum of 31536000000 (1 year)",
        ),
        (bad_epoch, 400, r#"invalid argument: attach_epoch must be 16 hex digits, got "xyz""#),
        (attach_cmd("nope", "g", 0, 9), 404, "topic not found"),
        (attach_cmd("p", "nope", 0, 9), 404, r#"topic not found: child topic "nope""#),
        (attach_cmd("p", "c", 0, 9), 409, r#"topic "c" is already attached to "p""#),
        (
            attach_cmd("c", "g", 0, 9),
            409,
            r#"topic "c" is a child of "p" and cannot have children"#,
        ),
        (
            attach_cmd("g", "p", 0, 9),
            409,
            r#"topic "p" is a parent of 1 children and cannot be attached"#,
        ),
        (attach_cmd("p", "d", 0, 9), 409, r#"topic "d" is already attached to parent "q""#),
        (
            attach_cmd("p", "g", 3_600_001, 9),
            400,
            "invalid argument: parent retention_ms (7200000) must be at least fanout_delay_ms + 1 hour (7200001)",
        ),
    ];
    for (cmd, status, text) in cases {
        let e = sm.refuse(cmd);
        assert_eq!((e.status(), e.to_string()), (status, text.to_owned()));
    }
    sm.attach("p", "g", 3_600_000, 10);
    assert!(sm.topic("g").is_delayed_child());
}

#[test]
fn attach_refuses_a_parent_that_has_108_children() {
    let mut sm = Sm::default();
    sm.create(req("p"));
    for i in 0..108 {
        sm.create(child_req(&format!("c{i}"), "p", 0));
    }
    sm.create(req("extra"));
    let e = sm.refuse(attach_cmd("p", "extra", 0, 1));
    assert_eq!(
        (e.status(), e.to_string()),
        (409, r#"parent topic "p" already has 108 children"#.into())
    );
    sm.run(detach_cmd("p", "c7")).unwrap();
    sm.attach("p", "extra", 0, 2);
    assert_eq!(sm.topic("p").children().len(), 108);
    assert_eq!(sm.topic("p").children().last().map(String::as_str), Some("extra"), "attach order");
}

#[test]
fn an_attached_child_adopts_the_parents_history_or_must_already_have_it() {
    let mut sm = Sm::default();
    sm.create(with_schema("p", S1));
    sm.alter("p", schema_alter(S2)).unwrap();
    sm.create(req("bare"));
    sm.attach("p", "bare", 0, 1);
    assert_eq!(sm.schema_texts("bare"), vec![S1, S2], "the full history is adopted");

    sm.create(with_schema("same", S1));
    sm.alter("same", schema_alter(S2)).unwrap();
    sm.attach("p", "same", 0, 2);
    assert_eq!(sm.schema_texts("same"), vec![S1, S2]);

    sm.create(with_schema("newer", S2));
    let e = sm.refuse(attach_cmd("p", "newer", 0, 3));
    assert_eq!(e.status(), 409);
    assert_eq!(
        e.to_string(),
        r#"schema mismatch: child "newer" must have no schema or the same schema history as parent "p""#
    );
    sm.create(req("plain"));
    let e = sm.refuse(attach_cmd("plain", "newer", 0, 4));
    assert_eq!(e.status(), 409, "a child with a schema cannot join a parent without one");
    sm.create(req("nothing"));
    sm.attach("plain", "nothing", 0, 5);
    assert!(sm.state.schema_history("nothing").is_none());
}

#[test]
fn an_attach_counts_as_one_change_of_topics_and_of_schemas_when_adopting() {
    let mut sm = Sm::default();
    let v = |sm: &Sm| {
        let v = sm.state.versions();
        [v.topics, v.schemas, v.assignments, v.members, v.users]
    };
    sm.create(with_schema("p", S1));
    sm.create(req("c"));
    assert_eq!(v(&sm), [2, 1, 0, 0, 0]);
    sm.attach("p", "c", 0, 1);
    assert_eq!(v(&sm), [3, 2, 0, 0, 0]);
    sm.run(detach_cmd("p", "c")).unwrap();
    assert_eq!(v(&sm), [4, 2, 0, 0, 0], "a detach rewrites the two topics only");
}

#[test]
fn the_attach_request_checks_the_same_rules_before_proposing() {
    let mut sm = Sm::default();
    sm.create(req("p"));
    sm.create(req("c"));
    let resolve = |sm: &Sm, child: &str, delay: i64| {
        let r = AttachChildRequest { parent: "p".into(), child: child.into(), delay_ms: delay };
        r.resolve(&sm.state, 1_700_000_000_500, 0x1234)
    };
    let e = resolve(&sm, "c", -1).unwrap_err();
    assert_eq!(
        (e.status(), e.to_string()),
        (400, "invalid argument: delay_ms must be >= 0".into())
    );
    assert_eq!(resolve(&sm, "", 0).unwrap_err().to_string(), "invalid argument: child required");
    assert_eq!(resolve(&sm, "zz", 0).unwrap_err().status(), 404);
    let c = resolve(&sm, "c", 250).unwrap();
    assert_eq!(c.attach_epoch, "0000000000001234");
    assert_eq!((c.fanout_delay_ms, c.attached_at_ms), (250, 1_700_000_000_500));
    sm.run(Command::AttachChild(c.clone())).unwrap();
    assert_eq!(resolve(&sm, "c", 0).unwrap_err().status(), 409);
}

fn assign(topic: &str, incarnation: u64, parts: &[(u32, &str)]) -> Command {
    Command::AssignPartitions(AssignPartitions {
        topic: topic.into(),
        incarnation,
        assignments: parts
            .iter()
            .map(|(p, owner)| crate::command::PartitionAssignment {
                partition: *p,
                owner_id: (*owner).into(),
                target_id: None,
            })
            .collect(),
        unassigned_only: false,
    })
}

#[test]
fn assignments_belong_to_one_incarnation_and_die_with_it() {
    let mut sm = Sm::default();
    let t = sm.create(req("t"));
    sm.run(assign("t", t.incarnation(), &[(0, "n1"), (1, "n1"), (2, "n2")])).unwrap();
    assert_eq!(sm.state.assignment("t", 2).unwrap().owner_id, "n2");
    sm.run(assign("t", t.incarnation(), &[(2, "n1")])).unwrap();
    assert_eq!(sm.state.assignments("t").unwrap().len(), 3);
    assert_eq!(sm.state.assignment("t", 2).unwrap().owner_id, "n1");
    let e = sm.refuse(assign("t", t.incarnation(), &[(3, "n1")]));
    assert_eq!(e.to_string(), r#"invalid argument: partition 3 out of range (topic "t" has 3)"#);
    assert_eq!(sm.refuse(assign("t", t.incarnation(), &[(0, "")])).status(), 400);
    sm.delete("t").unwrap();
    assert!(sm.state.assignments("t").is_none());
    let again = sm.create(req("t"));
    assert!(sm.state.assignment("t", 0).is_none());
    let e = sm.refuse(assign("t", t.incarnation(), &[(0, "n1")]));
    assert_eq!(e.status(), 409);
    sm.run(assign("t", again.incarnation(), &[(0, "n1")])).unwrap();
    assert_eq!(sm.refuse(assign("nope", 1, &[])).status(), 404);
}

#[test]
fn placing_only_unassigned_partitions_never_moves_an_assigned_one() {
    // A create's placement and a controller tick planned on the same view
    // both propose owners for partition 1: the second to apply places
    // nothing that the first placed.
    let mut sm = Sm::default();
    let t = sm.create(req("t"));
    let mut first = assign("t", t.incarnation(), &[(0, "n1"), (1, "n2")]);
    let mut second = assign("t", t.incarnation(), &[(1, "n3"), (2, "n3")]);
    for c in [&mut first, &mut second] {
        let Command::AssignPartitions(a) = c else { unreachable!() };
        a.unassigned_only = true;
    }
    sm.run(first).unwrap();
    sm.run(second.clone()).unwrap();
    let owners: Vec<&str> =
        (0..3).map(|p| sm.state.assignment("t", p).unwrap().owner_id.as_str()).collect();
    assert_eq!(owners, ["n1", "n2", "n3"]);
    // Without the flag an assignment is a (re)assignment, as before.
    let Command::AssignPartitions(mut a) = second else { unreachable!() };
    a.unassigned_only = false;
    sm.run(Command::AssignPartitions(a.clone())).unwrap();
    assert_eq!(sm.state.assignment("t", 1).unwrap().owner_id, "n3");
    // The flag is absent from the JSON when false, so older entries read
    // the same.
    let json = serde_json::to_string(&Command::AssignPartitions(a)).unwrap();
    assert!(!json.contains("unassigned_only"), "{json}");
}

fn member(id: &str, at: i64) -> Member {
    Member {
        id: id.into(),
        addr: "127.0.0.1:7942".into(),
        cluster_addr: None,
        status: MemberStatus::Alive,
        last_heartbeat: at,
        draining: false,
    }
}

#[test]
fn members_are_upserted_and_marked_dead() {
    let mut sm = Sm::default();
    sm.run(Command::MemberJoin(MemberJoin { member: member("n1", 10) })).unwrap();
    sm.run(Command::MemberJoin(MemberJoin { member: member("n1", 15) })).unwrap();
    assert_eq!(sm.state.member("n1").unwrap().last_heartbeat, 15);
    sm.run(Command::MemberDead(MemberDead { id: "n1".into(), last_heartbeat: None })).unwrap();
    assert_eq!(sm.state.member("n1").unwrap().status, MemberStatus::Dead);
    sm.run(Command::MemberJoin(MemberJoin { member: member("n1", 20) })).unwrap();
    assert_eq!(sm.state.member("n1").unwrap().status, MemberStatus::Alive);
    let e = sm.refuse(Command::MemberDead(MemberDead { id: "n9".into(), last_heartbeat: None }));
    assert_eq!((e.status(), e.to_string()), (404, "member not found".to_owned()));
    let e = sm.refuse(Command::MemberJoin(MemberJoin { member: member("", 1) }));
    assert_eq!(e.to_string(), "invalid argument: member id required");
}

#[test]
fn each_command_bumps_the_counter_of_each_domain_it_changed_once() {
    let mut sm = Sm::default();
    let v = |sm: &Sm| {
        let v = sm.state.versions();
        [v.topics, v.schemas, v.assignments, v.members, v.users]
    };
    let t = sm.create(with_schema("p", S1));
    assert_eq!(v(&sm), [1, 1, 0, 0, 0]);
    sm.create(child_req("c", "p", 0));
    assert_eq!(v(&sm), [2, 2, 0, 0, 0], "a child create writes two topics and a schema copy");
    sm.alter("p", AlterTopicRequest { max_in_flight_per_partition: Some(3), ..Default::default() })
        .unwrap();
    assert_eq!(v(&sm), [3, 2, 0, 0, 0]);
    sm.alter("p", schema_alter(S2)).unwrap();
    assert_eq!(v(&sm), [3, 3, 0, 0, 0], "a new schema version changes no topic record");
    sm.run(assign("p", t.incarnation(), &[(0, "n1")])).unwrap();
    assert_eq!(v(&sm), [3, 3, 1, 0, 0]);
    sm.run(Command::MemberJoin(MemberJoin { member: member("n1", 1) })).unwrap();
    assert_eq!(v(&sm), [3, 3, 1, 1, 0]);
    sm.delete("p").unwrap();
    assert_eq!(v(&sm), [4, 4, 2, 1, 0]);
    sm.refuse(Command::DeleteTopic(DeleteTopic { name: "p".into() }));
    assert_eq!(v(&sm), [4, 4, 2, 1, 0]);
}

#[test]
#[should_panic(expected = "is not after the applied index")]
fn apply_refuses_an_index_that_does_not_grow() {
    let mut sm = Sm::default();
    sm.create(req("t"));
    let cmd = sm.create_cmd(req("u"));
    let _ = apply(&sm.state, sm.state.applied_index(), &cmd);
}

fn page_names(page: &crate::state::TopicPage) -> Vec<&str> {
    page.topics.iter().map(|t| t.name()).collect()
}

#[test]
fn listing_pages_by_name_in_byte_order() {
    let mut sm = Sm::default();
    for name in ["b", "a", "C", "a.1", "z", "_"] {
        sm.create(req(name));
    }
    let p1 = sm.state.list_topics("", 2);
    assert_eq!((page_names(&p1), p1.next_page_token.as_str()), (vec!["C", "_"], "_"));
    let p2 = sm.state.list_topics(&p1.next_page_token, 2);
    assert_eq!((page_names(&p2), p2.next_page_token.as_str()), (vec!["a", "a.1"], "a.1"));
    let p3 = sm.state.list_topics(&p2.next_page_token, 2);
    assert_eq!((page_names(&p3), p3.next_page_token.as_str()), (vec!["b", "z"], ""));
    let all = sm.state.list_topics("", 0);
    assert_eq!((all.topics.len(), all.next_page_token.as_str()), (6, ""));
}

#[test]
fn a_deleted_page_token_resumes_at_the_next_name() {
    let mut sm = Sm::default();
    for name in ["a", "b", "c", "d"] {
        sm.create(req(name));
    }
    let p1 = sm.state.list_topics("", 2);
    assert_eq!(p1.next_page_token, "b");
    sm.delete("b").unwrap();
    let p2 = sm.state.list_topics(&p1.next_page_token, 2);
    assert_eq!((page_names(&p2), p2.next_page_token.as_str()), (vec!["c", "d"], ""));
    assert!(sm.state.list_topics("zzz", 10).topics.is_empty());
}

#[test]
fn listing_limits_are_clamped_to_a_thousand() {
    let mut sm = Sm::default();
    for i in 0..1001 {
        sm.create(req(&format!("t{i:04}")));
    }
    let page = sm.state.list_topics("", 5000);
    assert_eq!((page.topics.len(), page.next_page_token.as_str()), (1000, "t0999"));
    assert_eq!(sm.state.list_topics("", 0).topics.len(), 100);
    let last = sm.state.list_topics(&page.next_page_token, 5000);
    assert_eq!((page_names(&last), last.next_page_token.as_str()), (vec!["t1000"], ""));
}

fn a_user(name: &str, grants: Vec<crate::user::Grant>) -> crate::user::User {
    crate::user::User {
        username: name.into(),
        password_hash: "$2b$10$x".into(),
        grants,
        root: false,
        created_at_ms: 1,
        updated_at_ms: 1,
    }
}

fn produce_grant(p: &str) -> crate::user::Grant {
    crate::user::Grant { action: crate::user::Action::Produce, patterns: vec![p.into()] }
}

#[test]
fn users_are_created_updated_and_deleted_and_bump_the_users_counter() {
    use crate::command::{CreateUser, DeleteUser, UpdateUser};
    let mut sm = Sm::default();
    let created = sm.run(Command::CreateUser(CreateUser { user: a_user("bob", vec![]) })).unwrap();
    assert!(matches!(created, Response::User(ref u) if u.username == "bob"));
    assert_eq!(sm.state.versions().users, 1);
    let e = sm.refuse(Command::CreateUser(CreateUser { user: a_user("bob", vec![]) }));
    assert_eq!((e.status(), e.to_string()), (409, "user already exists".to_owned()));
    sm.run(Command::UpdateUser(UpdateUser {
        username: "bob".into(),
        grants: Some(vec![produce_grant("o*")]),
        password_hash: Some("$2b$10$y".into()),
        updated_at_ms: 7,
    }))
    .unwrap();
    let bob = sm.state.user("bob").unwrap();
    assert_eq!(
        (bob.grants.len(), bob.password_hash.as_str(), bob.updated_at_ms),
        (1, "$2b$10$y", 7)
    );
    assert_eq!(bob.created_at_ms, 1);
    assert_eq!(sm.state.versions().users, 2);
    let e = sm.refuse(Command::UpdateUser(UpdateUser {
        username: "bob".into(),
        grants: Some(vec![produce_grant("a b")]),
        password_hash: None,
        updated_at_ms: 8,
    }));
    assert_eq!(e.status(), 400);
    sm.run(Command::DeleteUser(DeleteUser { username: "bob".into() })).unwrap();
    assert!(sm.state.user("bob").is_none());
    let e = sm.refuse(Command::DeleteUser(DeleteUser { username: "bob".into() }));
    assert_eq!((e.status(), e.to_string()), (404, "not found".to_owned()));
    assert_eq!(sm.state.versions().users, 3);
    assert_eq!(sm.state.versions().topics, 0, "user commands touch no other domain");
}

#[test]
fn a_user_who_owns_topics_is_not_deleted() {
    use crate::command::{CreateUser, DeleteUser};
    let mut sm = Sm::default();
    sm.run(Command::CreateUser(CreateUser { user: a_user("bob", vec![]) })).unwrap();
    sm.create(CreateTopicRequest { owner: "bob".into(), ..req("b1") });
    sm.create(CreateTopicRequest { owner: "bobby".into(), ..req("b2") });
    let e = sm.refuse(Command::DeleteUser(DeleteUser { username: "bob".into() }));
    assert_eq!(
        (e.status(), e.to_string()),
        (409, "user owns topics (b1): delete them first".to_owned())
    );
    sm.delete("b1").unwrap();
    sm.run(Command::DeleteUser(DeleteUser { username: "bob".into() })).unwrap();
    assert!(sm.state.user("bob").is_none());
}

#[test]
fn the_root_user_is_seeded_once_and_protected() {
    use crate::command::{CreateUser, DeleteUser, SeedRootUser, UpdateUser};
    let mut sm = Sm::default();
    let e = sm.refuse(Command::CreateUser(CreateUser {
        user: crate::user::User { root: true, ..a_user("sneaky", vec![]) },
    }));
    assert_eq!(e.status(), 400, "only the seed makes a root");
    let root = crate::user::User { root: true, ..a_user("admin", vec![]) };
    sm.run(Command::SeedRootUser(SeedRootUser { user: root.clone() })).unwrap();
    assert!(sm.state.has_root());
    let e = sm.refuse(Command::SeedRootUser(SeedRootUser { user: root }));
    assert_eq!(e.status(), 409);
    let e = sm.refuse(Command::DeleteUser(DeleteUser { username: "admin".into() }));
    assert_eq!((e.status(), e.to_string()), (403, "the root user cannot be deleted".to_owned()));
    let e = sm.refuse(Command::UpdateUser(UpdateUser {
        username: "admin".into(),
        grants: Some(vec![]),
        password_hash: None,
        updated_at_ms: 2,
    }));
    assert_eq!(e.status(), 403);
    sm.run(Command::UpdateUser(UpdateUser {
        username: "admin".into(),
        grants: None,
        password_hash: Some("$2b$10$new".into()),
        updated_at_ms: 2,
    }))
    .unwrap();
    assert_eq!(sm.state.user("admin").unwrap().password_hash, "$2b$10$new");
}

/// A state with members n1..n4 alive and topic `t` (4 partitions) on n1..n3
/// (partition 3 on n1): returns the topic's incarnation.
fn moving_state(sm: &mut Sm) -> u64 {
    for id in ["n1", "n2", "n3", "n4"] {
        sm.run(Command::MemberJoin(MemberJoin { member: member(id, 10) })).unwrap();
    }
    let t = sm.create(CreateTopicRequest { name: "t".into(), partitions: 4, ..Default::default() });
    let inc = t.incarnation;
    sm.run(assign("t", inc, &[(0, "n1"), (1, "n2"), (2, "n3"), (3, "n1")])).unwrap();
    inc
}

fn target(inc: u64, p: u32, owner: &str, to: &str) -> Command {
    Command::SetAssignmentTarget(SetAssignmentTarget {
        topic: "t".into(),
        incarnation: inc,
        partition: p,
        expected_owner: owner.into(),
        target_id: to.into(),
    })
}

fn complete(inc: u64, p: u32, owner: &str, to: &str) -> Command {
    Command::CompleteMove(CompleteMove {
        topic: "t".into(),
        incarnation: inc,
        partition: p,
        expected_owner: owner.into(),
        target_id: to.into(),
        attempt: None,
    })
}

fn abort(inc: u64, p: u32, to: &str) -> Command {
    Command::AbortMove(AbortMove {
        topic: "t".into(),
        incarnation: inc,
        partition: p,
        expected_target: to.into(),
        attempt: None,
    })
}

fn with_attempt(mut cmd: Command, attempt: Option<u64>) -> Command {
    match &mut cmd {
        Command::CompleteMove(c) => c.attempt = attempt,
        Command::AbortMove(c) => c.attempt = attempt,
        _ => unreachable!("only move outcomes name an attempt"),
    }
    cmd
}

/// The same move between the same two members, aborted and planned again,
/// is another attempt: the earlier attempt's late flip or abort (a mover's
/// or a source's proposal delayed past the re-plan) is refused, where a
/// compare and set on owner and target alone would let it act on the new
/// attempt (cluster_sim seed 472: a late flip installed a copy older than
/// what the source committed after the abort).
#[test]
fn an_earlier_attempt_of_the_same_move_can_neither_flip_nor_abort_the_next() {
    let mut sm = Sm::default();
    let inc = moving_state(&mut sm);
    sm.run(target(inc, 0, "n1", "n4")).unwrap();
    let first = sm.state.assignment("t", 0).unwrap().move_attempt;
    assert_eq!(first, Some(sm.state.applied_index()), "the attempt is the command's index");
    sm.run(with_attempt(abort(inc, 0, "n4"), first)).unwrap();
    assert_eq!(sm.state.assignment("t", 0).unwrap().move_attempt, None);
    sm.run(target(inc, 0, "n1", "n4")).unwrap();
    let second = sm.state.assignment("t", 0).unwrap().move_attempt;
    assert!(second > first, "{second:?} after {first:?}");
    let e = sm.refuse(with_attempt(complete(inc, 0, "n1", "n4"), first));
    assert!(e.to_string().contains("was given up"), "{e}");
    assert_eq!(sm.refuse(with_attempt(abort(inc, 0, "n4"), first)).status(), 409);
    sm.run(with_attempt(complete(inc, 0, "n1", "n4"), second)).unwrap();
    let a = sm.state.assignment("t", 0).unwrap();
    assert_eq!((a.owner_id.as_str(), a.target_id.as_deref(), a.move_attempt), ("n4", None, None));
}

#[test]
fn a_move_flips_the_owner_only_through_a_compare_and_set_on_owner_and_target() {
    let mut sm = Sm::default();
    let inc = moving_state(&mut sm);
    sm.run(target(inc, 0, "n1", "n4")).unwrap();
    let a = sm.state.assignment("t", 0).unwrap();
    assert_eq!((a.owner_id.as_str(), a.target_id.as_deref()), ("n1", Some("n4")));
    // Setting the same target again is a no-op; another target is refused.
    sm.run(target(inc, 0, "n1", "n4")).unwrap();
    let e = sm.refuse(target(inc, 0, "n1", "n2"));
    assert_eq!((e.status(), e.to_string().contains("already moving to n4")), (409, true));
    // A completion that saw another owner or target changes nothing.
    assert_eq!(sm.refuse(complete(inc, 0, "n2", "n4")).status(), 409);
    assert_eq!(sm.refuse(complete(inc, 0, "n1", "n3")).status(), 409);
    // An abort that saw another target changes nothing either.
    assert_eq!(sm.refuse(abort(inc, 0, "n3")).status(), 409);
    sm.run(complete(inc, 0, "n1", "n4")).unwrap();
    let a = sm.state.assignment("t", 0).unwrap();
    assert_eq!((a.owner_id.as_str(), a.target_id.as_deref()), ("n4", None));
    // The same completion again (a retry, a racing proposer) and an abort
    // after the flip are both refused: the flip happened once.
    assert_eq!(sm.refuse(complete(inc, 0, "n1", "n4")).status(), 409);
    assert_eq!(sm.refuse(abort(inc, 0, "n4")).status(), 409);
}

#[test]
fn an_abort_clears_the_target_and_keeps_the_owner() {
    let mut sm = Sm::default();
    let inc = moving_state(&mut sm);
    sm.run(target(inc, 1, "n2", "n4")).unwrap();
    sm.run(abort(inc, 1, "n4")).unwrap();
    let a = sm.state.assignment("t", 1).unwrap();
    assert_eq!((a.owner_id.as_str(), a.target_id.as_deref()), ("n2", None));
    // Once aborted, the completion the copier was about to send fails.
    assert_eq!(sm.refuse(complete(inc, 1, "n2", "n4")).status(), 409);
}

#[test]
fn a_move_target_must_be_another_alive_member_that_is_not_draining() {
    let mut sm = Sm::default();
    let inc = moving_state(&mut sm);
    assert_eq!(sm.refuse(target(inc, 0, "n2", "n4")).status(), 409, "stale owner");
    assert_eq!(sm.refuse(target(inc, 0, "n1", "n1")).status(), 400, "already there");
    assert_eq!(sm.refuse(target(inc, 0, "n1", "n9")).status(), 404, "unknown member");
    assert_eq!(sm.refuse(target(inc + 1, 0, "n1", "n4")).status(), 409, "other incarnation");
    sm.run(Command::MemberDead(MemberDead { id: "n3".into(), last_heartbeat: None })).unwrap();
    let e = sm.refuse(target(inc, 0, "n1", "n3"));
    assert!(e.to_string().contains("it is dead"), "{e}");
    sm.run(Command::SetMemberDraining(SetMemberDraining { id: "n4".into(), draining: true }))
        .unwrap();
    let e = sm.refuse(target(inc, 0, "n1", "n4"));
    assert!(e.to_string().contains("it is draining"), "{e}");
    let missing = Command::SetAssignmentTarget(SetAssignmentTarget {
        topic: "nope".into(),
        incarnation: inc,
        partition: 0,
        expected_owner: "n1".into(),
        target_id: "n2".into(),
    });
    assert_eq!(sm.refuse(missing).status(), 404);
}

#[test]
fn at_most_the_cluster_wide_cap_of_moves_is_in_flight() {
    let mut sm = Sm::default();
    for id in ["n1", "n2"] {
        sm.run(Command::MemberJoin(MemberJoin { member: member(id, 10) })).unwrap();
    }
    let n = MAX_MOVES_IN_FLIGHT as u32 + 1;
    let t = sm.create(CreateTopicRequest {
        name: "t".into(),
        partitions: i64::from(n),
        ..Default::default()
    });
    let inc = t.incarnation;
    let all: Vec<(u32, &str)> = (0..n).map(|p| (p, "n1")).collect();
    sm.run(assign("t", inc, &all)).unwrap();
    for p in 0..n - 1 {
        sm.run(target(inc, p, "n1", "n2")).unwrap();
    }
    let e = sm.refuse(target(inc, n - 1, "n1", "n2"));
    assert!(e.to_string().contains("moves are in flight"), "{e}");
    sm.run(complete(inc, 0, "n1", "n2")).unwrap();
    sm.run(target(inc, n - 1, "n1", "n2")).unwrap();
}

#[test]
fn draining_is_set_by_its_command_and_survives_heartbeats() {
    let mut sm = Sm::default();
    sm.run(Command::MemberJoin(MemberJoin { member: member("n1", 10) })).unwrap();
    let drain =
        |on| Command::SetMemberDraining(SetMemberDraining { id: "n1".into(), draining: on });
    sm.run(drain(true)).unwrap();
    // A heartbeat carries draining=false; the stored mark stays.
    sm.run(Command::MemberJoin(MemberJoin { member: member("n1", 15) })).unwrap();
    let m = sm.state.member("n1").unwrap();
    assert!(m.draining && m.last_heartbeat == 15);
    sm.run(drain(false)).unwrap();
    assert!(!sm.state.member("n1").unwrap().draining);
    let gone = Command::SetMemberDraining(SetMemberDraining { id: "n9".into(), draining: true });
    assert_eq!(sm.refuse(gone).status(), 404);
    // The stored record carries the mark only when set, so members written
    // before draining existed read back the same.
    let json = serde_json::to_string(&member("n1", 1)).unwrap();
    assert!(!json.contains("draining"), "{json}");
}

fn remove_cmd(id: &str, heartbeat: i64, starts: &[(&str, u64, u32, u64)]) -> Command {
    Command::RemoveMember(crate::command::RemoveMember {
        id: id.into(),
        last_heartbeat: heartbeat,
        partitions: starts
            .iter()
            .map(|&(topic, incarnation, partition, base_offset)| crate::command::RemovedPartition {
                topic: topic.into(),
                incarnation,
                partition,
                base_offset,
            })
            .collect(),
    })
}

fn dead(sm: &mut Sm, id: &str) {
    sm.run(Command::MemberDead(MemberDead { id: id.into(), last_heartbeat: None })).unwrap();
}

#[test]
fn removing_a_dead_member_gives_each_of_its_partitions_a_new_owner_and_start_offset() {
    let mut sm = Sm::default();
    let inc = moving_state(&mut sm);
    // A second topic with two partitions on n3, and a move from n3 and
    // one to n3 in flight.
    let u = sm.create(CreateTopicRequest { name: "u".into(), partitions: 3, ..Default::default() });
    sm.run(assign("u", u.incarnation, &[(0, "n3"), (1, "n3"), (2, "n2")])).unwrap();
    sm.run(target(inc, 2, "n3", "n4")).unwrap();
    sm.run(target(inc, 1, "n2", "n3")).unwrap();
    dead(&mut sm, "n3");
    let (ui, before) = (u.incarnation, sm.state.clone());
    let starts = [("t", inc, 2, 1_048_700), ("u", ui, 0, 1_048_576), ("u", ui, 1, 1_049_000)];
    let Response::MemberRemoved { member, reassigned } =
        sm.run(remove_cmd("n3", 10, &starts)).unwrap()
    else {
        panic!("op 17 answers MemberRemoved")
    };
    assert_eq!(member.id, "n3");
    assert!(sm.state.member("n3").is_none(), "the record is gone");
    let got: Vec<(&str, u32, &str, u64)> = reassigned
        .iter()
        .map(|r| (r.topic.as_str(), r.partition, r.owner_id.as_str(), r.base_offset))
        .collect();
    // Loads before: n1 2, n2 2 (t/1, u/2), n4 0: the least loaded first.
    assert_eq!(
        got,
        vec![("t", 2, "n4", 1_048_700), ("u", 0, "n4", 1_048_576), ("u", 1, "n1", 1_049_000)]
    );
    for r in &reassigned {
        let a = sm.state.assignment(&r.topic, r.partition).unwrap();
        assert_eq!(
            (a.owner_id.as_str(), a.target_id.as_deref(), a.base_offset),
            (r.owner_id.as_str(), None, Some(r.base_offset))
        );
    }
    // The move to n3 is cleared, its owner kept; nothing else changed.
    let a = sm.state.assignment("t", 1).unwrap();
    assert_eq!((a.owner_id.as_str(), a.target_id.as_deref(), a.base_offset), ("n2", None, None));
    assert_eq!(sm.state.assignment("t", 0), before.assignment("t", 0));
    assert_eq!(sm.state.assignment("u", 2), before.assignment("u", 2));
    assert_eq!(sm.state.versions.members, before.versions.members + 1);
    assert_eq!(sm.state.versions.assignments, before.versions.assignments + 1);
    // A second removal finds no member.
    assert_eq!(sm.refuse(remove_cmd("n3", 10, &starts)).status(), 404);
    // The assignment's start offset is stored only when set.
    let json = serde_json::to_string(sm.state.assignment("t", 0).unwrap()).unwrap();
    assert_eq!(json, r#"{"owner_id":"n1"}"#);
    let json = serde_json::to_string(sm.state.assignment("u", 0).unwrap()).unwrap();
    assert_eq!(json, r#"{"owner_id":"n4","base_offset":1048576}"#);
}

#[test]
fn a_removal_is_refused_unless_the_member_is_dead_as_the_proposer_saw_it() {
    let mut sm = Sm::default();
    let inc = moving_state(&mut sm);
    let starts = [("t", inc, 2, 5)];
    let e = sm.refuse(remove_cmd("n3", 10, &starts));
    assert!((e.status(), e.to_string().contains("is alive")) == (409, true), "{e}");
    assert_eq!(sm.refuse(remove_cmd("n9", 10, &starts)).status(), 404);
    dead(&mut sm, "n3");
    // It came back and died again since the proposer looked: another
    // heartbeat.
    sm.run(Command::MemberJoin(MemberJoin { member: member("n3", 11) })).unwrap();
    dead(&mut sm, "n3");
    let e = sm.refuse(remove_cmd("n3", 10, &starts));
    assert!(e.to_string().contains("may have come back"), "{e}");
    // A partition the proposer did not plan (a topic placed on it since).
    let e = sm.refuse(remove_cmd("n3", 11, &[("t", inc + 1, 2, 5)]));
    assert!(e.to_string().contains("has no start offset"), "{e}");
    sm.run(remove_cmd("n3", 11, &starts)).unwrap();
    assert_eq!(sm.state.assignment("t", 2).unwrap().base_offset, Some(5));
}

#[test]
fn a_removal_keeps_a_child_partition_off_its_parent_partitions_owner_and_needs_a_live_member() {
    let mut sm = Sm::default();
    for id in ["n1", "n2", "n3"] {
        sm.run(Command::MemberJoin(MemberJoin { member: member(id, 10) })).unwrap();
    }
    let p = sm.create(CreateTopicRequest { name: "p".into(), partitions: 3, ..Default::default() });
    let c = sm.create(CreateTopicRequest {
        name: "c".into(),
        parent: "p".into(),
        partitions: 3,
        ..Default::default()
    });
    sm.run(assign("p", p.incarnation, &[(0, "n1"), (1, "n1"), (2, "n3")])).unwrap();
    sm.run(assign("c", c.incarnation, &[(0, "n3"), (1, "n3"), (2, "n1")])).unwrap();
    dead(&mut sm, "n3");
    let starts =
        [("p", p.incarnation, 2, 7), ("c", c.incarnation, 0, 8), ("c", c.incarnation, 1, 9)];
    sm.run(remove_cmd("n3", 10, &starts)).unwrap();
    // n2 owns nothing and takes p/2 first; c/0 and c/1 would go to the
    // least loaded, but n1 owns p/0 and p/1: they go to n2.
    let owner = |t: &str, i: u32| sm.state.assignment(t, i).unwrap().owner_id.clone();
    assert_eq!([owner("p", 2), owner("c", 0), owner("c", 1)], ["n2", "n2", "n2"]);
    for i in 0..3 {
        assert_ne!(owner("p", i), owner("c", i), "partition {i}");
    }
    // With nobody alive left to take them, nothing is removed.
    let mut sm2 = Sm::default();
    sm2.run(Command::MemberJoin(MemberJoin { member: member("n1", 10) })).unwrap();
    let t =
        sm2.create(CreateTopicRequest { name: "t".into(), partitions: 3, ..Default::default() });
    sm2.run(assign("t", t.incarnation, &[(0, "n1")])).unwrap();
    dead(&mut sm2, "n1");
    let e = sm2.refuse(remove_cmd("n1", 10, &[("t", t.incarnation, 0, 0)]));
    assert!(e.to_string().contains("no member is alive"), "{e}");
}
