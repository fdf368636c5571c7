//! Black-box tests of the cluster control plane (issue 23 part 5): real
//! `narad serve` processes on loopback (common/cluster.rs), each test
//! bounded in time and independent of the others.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::ADMIN_PASSWORD;
use common::cluster::{Cluster, ClusterOpts, wait_for};
use reqwest::Method;
use serde_json::{Value, json};

const READY: Duration = Duration::from_secs(30);

/// The members node `i` lists, as (id, status); None: no answer.
fn members(c: &Cluster, i: usize) -> Option<Vec<(String, String)>> {
    let (status, v) = c.get_json(i, "/v1/cluster/members")?;
    (status == 200).then(|| {
        v["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (m["id"].as_str().unwrap().to_owned(), m["status"].as_str().unwrap().to_owned())
            })
            .collect()
    })
}

/// A follower of the current leader (the first running node that is not it).
fn follower(c: &Cluster, leader: usize) -> usize {
    (0..c.len()).find(|&i| i != leader && c.node(i).is_running()).unwrap()
}

/// POST a topic through node `i`; its status and body.
fn create_topic(c: &Cluster, i: usize, name: &str, partitions: u32) -> (u16, String) {
    let r = c
        .request(i, Method::POST, "/v1/topics")
        .body(json!({"name": name, "partitions": partitions}).to_string())
        .send()
        .unwrap();
    (r.status().as_u16(), r.text().unwrap())
}

/// The view of topic `t` that every node must agree on: partition count
/// and each partition's owner (None: 404).
fn topic_view(c: &Cluster, i: usize, t: &str) -> Option<Option<Vec<Value>>> {
    let (status, v) = c.get_json(i, &format!("/v1/topics/{t}"))?;
    match status {
        404 => Some(None),
        200 => Some(Some(
            v["partition_stats"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| json!([p["partition"], p["owner_node"]]))
                .collect(),
        )),
        _ => None,
    }
}

/// Waits until every running node shows `want` for topic `t`.
fn wait_topic_everywhere(c: &Cluster, t: &str, want: &Option<Vec<Value>>, within: Duration) {
    let running: Vec<usize> = (0..c.len()).filter(|&i| c.node(i).is_running()).collect();
    wait_for(
        within,
        &format!("topic {t} the same on every node: {want:?}"),
        || running.iter().all(|&i| topic_view(c, i, t).as_ref() == Some(want)).then_some(()),
        || {
            let views: Vec<_> = running.iter().map(|&i| topic_view(c, i, t)).collect();
            format!("views: {views:?}\n{}", c.describe())
        },
    );
}

/// Retries a create through node `i` until it answers 201 or `within`
/// passes (panics with the last answer); returns the time it took.
fn create_until_ok(c: &Cluster, i: usize, name: &str, within: Duration) -> Duration {
    let start = Instant::now();
    let mut last = (0, String::new());
    while start.elapsed() < within {
        match c
            .request(i, Method::POST, "/v1/topics")
            .body(json!({"name": name}).to_string())
            .send()
        {
            Ok(r) => {
                last = (r.status().as_u16(), r.text().unwrap_or_default());
                if last.0 == 201 {
                    return start.elapsed();
                }
                // A retried create that landed before its answer was lost.
                if last.0 == 409 {
                    return start.elapsed();
                }
            }
            Err(e) => last = (0, e.to_string()),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!(
        "create {name} through {} not ok within {within:?}: {last:?}\n{}",
        c.node(i).id,
        c.describe()
    );
}

#[test]
fn three_nodes_bootstrap_list_three_alive_members_and_agree_on_one_leader() {
    let c = Cluster::start(3, ClusterOpts::dev());
    let leader = c.leader(Duration::from_secs(15));
    let want: Vec<(String, String)> =
        ["n1", "n2", "n3"].iter().map(|id| (id.to_string(), "alive".to_owned())).collect();
    wait_for(
        Duration::from_secs(15),
        "every node lists n1..n3 alive and names the same leader",
        || {
            (0..3)
                .all(|i| {
                    let mut m = members(&c, i).unwrap_or_default();
                    m.sort();
                    let s = c.status(i).unwrap_or_default();
                    m == want && s["leader"] == c.node(leader).id.as_str() && s["mode"] == "cluster"
                })
                .then_some(())
        },
        || c.describe(),
    );
    let leaders: Vec<usize> =
        (0..3).filter(|&i| c.status(i).is_some_and(|s| s["role"] == "leader")).collect();
    assert_eq!(leaders, vec![leader], "exactly one node leads\n{}", c.describe());
    for i in 0..3 {
        let s = c.status(i).unwrap();
        let mut voters: Vec<String> = s["voters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect();
        voters.sort();
        assert_eq!(voters, ["n1", "n2", "n3"], "{s}");
    }
}

#[test]
fn a_topic_created_altered_and_deleted_through_a_follower_looks_the_same_on_every_node() {
    let c = Cluster::start(3, ClusterOpts::dev());
    c.wait_all_alive(Duration::from_secs(20));
    let f = follower(&c, c.leader(Duration::from_secs(15)));
    let (st, body) = create_topic(&c, f, "orders", 3);
    assert_eq!(st, 201, "{body}");
    let view = topic_view(&c, f, "orders").unwrap();
    let owners: BTreeSet<String> =
        view.as_ref().unwrap().iter().map(|p| p[1].to_string()).collect();
    assert_eq!(owners.len(), 3, "3 partitions round robin over 3 members: {view:?}");
    wait_topic_everywhere(&c, "orders", &view, Duration::from_secs(10));

    let r = c
        .request(f, Method::PATCH, "/v1/topics/orders")
        .body(json!({"partitions": 5}).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().unwrap());
    let grown = topic_view(&c, f, "orders").unwrap();
    assert_eq!(grown.as_ref().unwrap().len(), 5, "{grown:?}");
    assert!(
        grown.as_ref().unwrap().iter().all(|p| p[1].is_string()),
        "every partition owned: {grown:?}"
    );
    wait_topic_everywhere(&c, "orders", &grown, Duration::from_secs(10));

    // Every node holds the topic's files once a record was committed into a
    // partition it owns: one record per partition, each through another
    // node than its owner, maybe.
    for p in 0..5 {
        let r = c
            .request(p % 3, Method::POST, &format!("/v1/topics/orders/produce?partition={p}"))
            .body("x")
            .send()
            .unwrap();
        assert_eq!(r.status(), 202, "{}", r.text().unwrap());
    }
    let dirs: Vec<_> = (0..3).map(|i| c.node(i).data_dir.join("topics/orders")).collect();
    wait_for(
        Duration::from_secs(10),
        "the topic's directory on every node",
        || dirs.iter().all(|d| d.exists()).then_some(()),
        || format!("{dirs:?}"),
    );

    let r = c.request(f, Method::DELETE, "/v1/topics/orders").send().unwrap();
    assert_eq!(r.status(), 204, "{}", r.text().unwrap());
    wait_topic_everywhere(&c, "orders", &None, Duration::from_secs(10));
    wait_for(
        Duration::from_secs(15),
        "the deleted topic's directory gone on every node",
        || dirs.iter().all(|d| !d.exists()).then_some(()),
        || {
            format!(
                "{:?}\n{}",
                dirs.iter().filter(|d| d.exists()).collect::<Vec<_>>(),
                c.describe()
            )
        },
    );
}

#[test]
fn a_user_created_through_a_follower_logs_in_on_every_node_of_a_secured_cluster() {
    let c = Cluster::start(3, ClusterOpts::secure("s3cret-cluster-0123456789abcdef0123"));
    let leader = c.leader(Duration::from_secs(15));
    let f = follower(&c, leader);
    let body = json!({"username": "bob", "password": "bob-pw", "grants": []});
    let r = c.request(f, Method::POST, "/v1/users").body(body.to_string()).send().unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().unwrap());
    for i in 0..3 {
        // Replicated first (asked as admin: no failed-password budget is
        // spent while bob is not there yet), then his password works and
        // a wrong one does not.
        wait_for(
            Duration::from_secs(10),
            &format!("bob replicated to {}", c.node(i).id),
            || {
                let (st, users) = c.get_json(i, "/v1/users")?;
                (st == 200 && users.to_string().contains("\"bob\"")).then_some(())
            },
            || c.describe(),
        );
        let get = |pw: &str| {
            c.client
                .get(c.node(i).url("/v1/topics"))
                .basic_auth("bob", Some(pw))
                .send()
                .map(|r| r.status().as_u16())
                .unwrap_or(0)
        };
        assert_eq!(get("bob-pw"), 200, "bob on {}", c.node(i).id);
        assert_eq!(get("wrong"), 401, "a wrong password on {}", c.node(i).id);
    }
    // Deleted through another node: refused everywhere.
    let other = (0..3).find(|&i| i != f).unwrap();
    let r = c.request(other, Method::DELETE, "/v1/users/bob").send().unwrap();
    assert_eq!(r.status(), 204, "{}", r.text().unwrap());
    for i in 0..3 {
        wait_for(
            Duration::from_secs(10),
            "bob refused on every node",
            || {
                let st = c
                    .client
                    .get(c.node(i).url("/v1/topics"))
                    .basic_auth("bob", Some("bob-pw"))
                    .send();
                st.is_ok_and(|r| r.status() == 401).then_some(())
            },
            || c.describe(),
        );
    }
    let _ = ADMIN_PASSWORD;
}

#[test]
fn five_nodes_fail_over_serve_writes_with_two_down_and_answer_503_without_quorum() {
    let mut c = Cluster::start(5, ClusterOpts::dev());
    let old = c.leader(Duration::from_secs(15));
    c.kill9(old);
    let took = Instant::now();
    let new = c.leader(Duration::from_secs(15));
    assert_ne!(new, old);
    for i in (0..5).filter(|&i| i != old) {
        create_until_ok(
            &c,
            i,
            &format!("after-failover-{i}"),
            Duration::from_secs(15).saturating_sub(took.elapsed()).max(Duration::from_secs(1)),
        );
    }
    // 2 of 5 down: kill a second node (a follower), writes still succeed.
    let second = (0..5).find(|&i| i != old && i != new).unwrap();
    c.kill9(second);
    let survivors: Vec<usize> = (0..5).filter(|&i| c.node(i).is_running()).collect();
    assert_eq!(survivors.len(), 3);
    for &i in &survivors {
        create_until_ok(&c, i, &format!("two-down-{i}"), Duration::from_secs(15));
    }
    // 3 of 5 down: no quorum, a write through either survivor is a 503.
    let third = *survivors.iter().find(|&&i| i != new).unwrap();
    c.kill9(third);
    let left: Vec<usize> = (0..5).filter(|&i| c.node(i).is_running()).collect();
    for &i in &left {
        let (st, body) = create_topic(&c, i, &format!("no-quorum-{i}"), 3);
        assert_eq!(st, 503, "through {}: {body}", c.node(i).id);
        assert!(body.contains("control plane temporarily unavailable"), "{body}");
    }
    // One back: quorum again, writes resume.
    c.restart(second);
    c.wait_ready(second, READY);
    for &i in &left {
        create_until_ok(&c, i, &format!("resumed-{i}"), Duration::from_secs(20));
    }
    for &i in &left {
        wait_topic_everywhere_one(&c, i, "resumed-{}", &left);
    }
}

/// Waits until node `i` sees every `resumed-<j>` topic.
fn wait_topic_everywhere_one(c: &Cluster, i: usize, pattern: &str, ids: &[usize]) {
    for &j in ids {
        let t = pattern.replace("{}", &j.to_string());
        wait_for(
            Duration::from_secs(10),
            &format!("{t} visible on {}", c.node(i).id),
            || topic_view(c, i, &t).flatten().map(|_| ()),
            || c.describe(),
        );
    }
}

/// Names of every topic node `i` lists.
fn topic_names(c: &Cluster, i: usize) -> Option<BTreeSet<String>> {
    let (st, v) = c.get_json(i, "/v1/topics?limit=1000")?;
    (st == 200).then(|| {
        v["topics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    })
}

fn restarted_node_catches_up(sigterm: bool, writes: usize, opts: ClusterOpts) {
    let mut c = Cluster::start(3, opts);
    let leader = c.leader(Duration::from_secs(15));
    let down = follower(&c, leader);
    let entry = (0..3).find(|&i| i != leader && i != down).unwrap();
    create_until_ok(&c, entry, "before", Duration::from_secs(10));
    if sigterm {
        assert!(c.terminate(down).success());
    } else {
        c.kill9(down);
    }
    for k in 0..writes {
        let (st, body) = create_topic(&c, entry, &format!("while-down-{k}"), 3);
        assert_eq!(st, 201, "{body}");
    }
    let want = topic_names(&c, entry).unwrap();
    assert_eq!(want.len(), writes + 1);
    c.restart(down);
    c.wait_ready(down, READY);
    wait_for(
        Duration::from_secs(20),
        "the restarted node lists every topic",
        || (topic_names(&c, down).as_ref() == Some(&want)).then_some(()),
        || format!("{:?}\n{}", topic_names(&c, down).map(|s| s.len()), c.describe()),
    );
}

#[test]
fn a_node_killed_with_sigkill_restarts_and_catches_up_from_the_log() {
    restarted_node_catches_up(false, 20, ClusterOpts::dev());
}

#[test]
fn a_node_stopped_with_sigterm_restarts_and_catches_up_by_snapshot_after_many_writes() {
    let opts = ClusterOpts::dev()
        .env("NARAD_RAFT_SNAPSHOT_AFTER_ENTRIES", "10")
        .env("NARAD_RAFT_ENTRIES_KEPT_AFTER_SNAPSHOT", "0");
    restarted_node_catches_up(true, 60, opts);
}

#[test]
fn a_join_only_node_joins_a_running_cluster_as_a_voter_and_alive_member() {
    let mut c = Cluster::prepare(4, ClusterOpts::dev().initial_members(&["n1", "n2", "n3"]));
    c.start_first(3);
    let leader = c.leader(Duration::from_secs(15));
    create_until_ok(&c, leader, "before-join", Duration::from_secs(10));
    let r = c
        .request(leader, reqwest::Method::POST, "/v1/topics")
        .body(serde_json::json!({"name": "wide", "partitions": 12}).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().unwrap_or_default());
    c.spawn(3);
    c.wait_ready(3, READY);
    wait_for(
        Duration::from_secs(20),
        "n4 a voter and an alive member on every node",
        || {
            (0..4)
                .all(|i| {
                    let voter = c.status(i).is_some_and(|s| {
                        s["voters"].as_array().is_some_and(|v| v.iter().any(|x| x == "n4"))
                    });
                    let alive = members(&c, i)
                        .is_some_and(|m| m.iter().any(|(id, st)| id == "n4" && st == "alive"));
                    voter && alive
                })
                .then_some(())
        },
        || c.describe(),
    );
    assert!(topic_names(&c, 3).unwrap().contains("before-join"));
    // The leader's planner gives n4 its share: 15 partitions over 4
    // members end 3 or 4 on each, the moves done, every node agreeing
    // (where create placed them depends on which members were alive then;
    // at most 8 moves run at once, so this may take a few ticks).
    let started = Instant::now();
    wait_for(
        Duration::from_secs(120),
        "15 partitions balanced over n1..n4 on every node, no move in flight",
        || {
            let views: Vec<Vec<(String, i64)>> = (0..4)
                .map(|i| {
                    let (_, m) = c.get_json(i, "/v1/cluster/members")?;
                    let (_, moves) = c.get_json(i, "/v1/cluster/moves")?;
                    (moves["moves"] == json!([])).then_some(())?;
                    m["members"]
                        .as_array()?
                        .iter()
                        .map(|m| {
                            Some((m["id"].as_str()?.to_owned(), m["owned_partitions"].as_i64()?))
                        })
                        .collect::<Option<Vec<_>>>()
                })
                .collect::<Option<_>>()?;
            let balanced = views[0].len() == 4
                && views[0].iter().all(|(_, n)| *n == 3 || *n == 4)
                && views[0].iter().map(|(_, n)| n).sum::<i64>() == 15;
            (balanced && views.iter().all(|v| v == &views[0])).then_some(())
        },
        || format!("{:?}\n{}", c.get_json(0, "/v1/cluster/members"), c.describe()),
    );
    eprintln!("n4 got its share {:?} after it was an alive voter", started.elapsed());
    let (_, plan) = c.get_json(3, "/v1/cluster/rebalance").unwrap();
    assert_eq!(plan["moves"], json!([]), "balanced: nothing left to plan");
    create_until_ok(&c, 3, "through-n4", Duration::from_secs(10));
    wait_topic_everywhere(
        &c,
        "through-n4",
        &topic_view(&c, 3, "through-n4").unwrap(),
        Duration::from_secs(10),
    );
}

#[test]
fn a_node_paused_over_thirty_seconds_is_marked_dead_and_alive_again_after_sigcont() {
    let mut c = Cluster::start(3, ClusterOpts::dev());
    let leader = c.leader(Duration::from_secs(15));
    let paused = follower(&c, leader);
    let id = c.node(paused).id.clone();
    let status_of = |c: &Cluster| {
        members(c, leader).and_then(|m| m.into_iter().find(|(i, _)| *i == id).map(|(_, s)| s))
    };
    c.stop(paused);
    let stopped_at = Instant::now();
    wait_for(
        Duration::from_secs(50),
        "the paused node marked dead",
        || (status_of(&c).as_deref() == Some("dead")).then_some(()),
        || c.describe(),
    );
    assert!(
        stopped_at.elapsed() >= Duration::from_secs(25),
        "dead too early: {:?}",
        stopped_at.elapsed()
    );
    c.cont(paused);
    wait_for(
        Duration::from_secs(20),
        "the resumed node alive again",
        || (status_of(&c).as_deref() == Some("alive")).then_some(()),
        || c.describe(),
    );
}

#[test]
fn nodes_with_a_wrong_or_missing_cluster_secret_are_refused_and_see_nothing_of_the_cluster() {
    // n1..n3 bootstrap with the secret; n4 presents a wrong one, n5 runs
    // --dev without any: both are join-only.
    let opts = ClusterOpts::secure("the-right-secret-0123456789abcdef")
        .initial_members(&["n1", "n2", "n3"])
        .node_env(3, "NARAD_CLUSTER_SECRET", "a-wrong-secret-0123456789abcdef00")
        .dev_node(4);
    let mut c = Cluster::prepare(5, opts);
    c.start_first(3);
    let leader = c.leader(Duration::from_secs(15));
    create_until_ok(&c, leader, "secret-topic", Duration::from_secs(10));
    c.spawn(3);
    c.spawn(4);
    wait_for(
        Duration::from_secs(20),
        "the secured nodes log rejected connections from both outsiders",
        || {
            let n = (0..3)
                .map(|i| c.node(i).log().matches("cluster connection rejected").count())
                .sum::<usize>();
            (n >= 2).then_some(())
        },
        || c.describe(),
    );
    // Let them try for a few more join rounds (every 2 s).
    std::thread::sleep(Duration::from_secs(5));
    for i in 0..3 {
        let s = c.status(i).unwrap();
        let all = format!("{} {}", s["voters"], s["learners"]);
        assert!(!all.contains("n4") && !all.contains("n5"), "{s}");
        let m = members(&c, i).unwrap();
        assert!(m.iter().all(|(id, _)| id != "n4" && id != "n5"), "{m:?}");
    }
    for i in [3, 4] {
        let (st, _) = c.get_json(i, "/readyz").unwrap_or((0, Value::Null));
        assert_ne!(st, 200, "{} must not be ready", c.node(i).id);
        if let Some(names) = topic_names(&c, i) {
            assert!(names.is_empty(), "{}: {names:?}", c.node(i).id);
        }
    }
}

/// `GET /v1/topics/{t}` on node `i` through the 10 s client (an owner that
/// does not answer takes up to the 5 s reply timeout); its partitions.
fn partition_stats(c: &Cluster, i: usize, t: &str) -> Vec<Value> {
    let r = c.request(i, Method::GET, &format!("/v1/topics/{t}")).send().unwrap();
    assert_eq!(r.status().as_u16(), 200, "details of {t} on {}", c.node(i).id);
    let v: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
    v["partition_stats"].as_array().unwrap().clone()
}

#[test]
fn topic_details_show_each_partitions_figures_from_its_owner_and_flag_an_owner_that_does_not_answer()
 {
    let mut c = Cluster::start(3, ClusterOpts::dev());
    c.wait_all_alive(Duration::from_secs(20));
    let leader = c.leader(Duration::from_secs(15));
    assert_eq!(create_topic(&c, leader, "figs", 3).0, 201);
    // Partitions are assigned at create over the live members.
    let owners: Vec<String> = wait_for(
        Duration::from_secs(15),
        "every partition of figs has an owner on every node",
        || {
            let views: Vec<_> = (0..3).map(|i| topic_view(&c, i, "figs")).collect();
            let first = views[0].clone()??;
            let owners: Option<Vec<String>> =
                first.iter().map(|p| p[1].as_str().map(str::to_owned)).collect();
            views.iter().all(|v| v.as_ref() == Some(&Some(first.clone()))).then_some(owners)?
        },
        || c.describe(),
    );
    // A partition owned by another node than the one asked.
    let (p, owner) = owners
        .iter()
        .enumerate()
        .find_map(|(p, o)| Some((p, c.index_of(o)?)).filter(|(_, o)| *o != 0))
        .expect("a partition owned by n2 or n3");
    // Records committed on the owner's log (produced through the owner).
    for n in 0..4 {
        let r = c
            .request(owner, Method::POST, &format!("/v1/topics/figs/produce?partition={p}"))
            .body(format!("{{\"n\":{n}}}"))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
    }
    let owner_id = c.node(owner).id.clone();
    let seen = wait_for(
        Duration::from_secs(15),
        "n1 shows the owner's figures of the partition",
        || {
            let stats = partition_stats(&c, 0, "figs");
            (stats[p]["next_offset"] == 4).then_some(stats)
        },
        || format!("n1: {:?}\n{}", partition_stats(&c, 0, "figs"), c.describe()),
    );
    assert_eq!(seen[p]["stats_from"], owner_id.as_str(), "{seen:?}");
    assert_eq!(seen[p]["owner_node"], owner_id.as_str());
    assert_eq!(seen[p]["status"], "ok");
    let (_, details) = c.get_json(0, "/v1/topics/figs").unwrap();
    assert!(details.get("partial").is_none(), "every owner answered: {details}");
    assert!(seen[p]["size_bytes"].as_u64().unwrap() > 0, "{seen:?}");
    for s in &seen {
        let from_owner = s["stats_from"] == s["owner_node"];
        let own = s["owner_node"] == "n1" && s["stats_from"] == "n1";
        assert!(from_owner || own, "every partition's figures come from its owner: {seen:?}");
    }
    // The owner dies: its partitions are flagged at once (no answer), with
    // this node's own figures, long before membership marks it dead.
    c.kill9(owner);
    let started = Instant::now();
    let stats = partition_stats(&c, 0, "figs");
    eprintln!("details with the owner killed took {:?}", started.elapsed());
    assert_eq!(stats[p]["status"], "owner_unavailable", "{stats:?}");
    assert_eq!(stats[p]["stats_from"], "n1", "{stats:?}");
    assert_eq!(stats[p]["next_offset"], 0, "n1's own log of the partition is empty: {stats:?}");
    assert_eq!(stats[p]["owner_liveness"], "alive", "not marked dead yet: {stats:?}");
    let (_, details) = c.get_json(0, "/v1/topics/figs").unwrap_or_default();
    assert_eq!(details["partial"], true, "an owner did not answer: {details}");
}

#[test]
fn a_topic_directory_a_replica_does_not_know_is_removed_only_once_the_leader_confirms_it_is_gone() {
    let mut c = Cluster::start(3, ClusterOpts::dev());
    c.wait_all_alive(Duration::from_secs(20));
    let leader = c.leader(Duration::from_secs(15));
    let created = create_topic(&c, leader, "kept", 3);
    assert_eq!(created.0, 201, "{created:?}");
    let n3 = 2;
    // A record committed into a partition n3 owns.
    let owned = wait_for(
        Duration::from_secs(15),
        "n3 owns a partition of kept",
        || {
            let view = topic_view(&c, n3, "kept")??;
            view.iter().position(|p| p[1] == c.node(n3).id.as_str())
        },
        || c.describe(),
    );
    let r = c
        .request(n3, Method::POST, &format!("/v1/topics/kept/produce?partition={owned}"))
        .body(r#"{"n":1}"#)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let topics = c.node(n3).data_dir.join("topics");
    wait_for(
        Duration::from_secs(15),
        "n3 opened its log of the partition of kept it owns",
        || topics.join("kept").join(format!("p{owned:05}")).exists().then_some(()),
        || c.describe(),
    );
    // Every node stops; n3 gets a directory of a topic nobody has (an
    // earlier incarnation's marker, so it is not "newer than the
    // metastore").
    for i in 0..3 {
        assert!(c.terminate(i).success());
    }
    copy_dir(&topics.join("kept"), &topics.join("ghost"));
    // Alone, n3 has no leader to ask: the directory stays.
    c.restart(n3);
    std::thread::sleep(Duration::from_secs(4));
    assert!(topics.join("ghost").exists(), "removed without a leader's confirmation");
    assert!(c.node(n3).log().contains("kept until the leader confirms"), "{}", c.node(n3).log());
    // With a quorum back, the leader confirms it is gone: removed; the
    // known topic's files stay.
    c.restart(0);
    c.wait_ready(n3, READY);
    wait_for(
        Duration::from_secs(20),
        "the unknown directory removed after the leader's confirmation",
        || (!topics.join("ghost").exists()).then_some(()),
        || c.node(n3).log_tail(),
    );
    let r = c
        .request(n3, Method::GET, &format!("/v1/topics/kept/consume?partition={owned}"))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "the known topic's record is still there");
    assert!(r.text().unwrap().contains(r#"{"n":1}"#));
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn delete_and_recreate_racing_through_different_nodes_converge_with_one_live_incarnation() {
    let c = Cluster::start(3, ClusterOpts::dev());
    c.leader(Duration::from_secs(15));
    let until = Instant::now() + Duration::from_secs(6);
    std::thread::scope(|s| {
        let create = s.spawn(|| {
            let mut n = 0;
            while Instant::now() < until {
                let (status, body) = create_topic(&c, 0, "churn", 3);
                assert!(matches!(status, 201 | 409 | 503), "create: {status} {body}");
                n += usize::from(status == 201);
            }
            n
        });
        let delete = s.spawn(|| {
            let mut n = 0;
            while Instant::now() < until {
                let r = c.request(1, Method::DELETE, "/v1/topics/churn").send().unwrap();
                let status = r.status().as_u16();
                assert!(matches!(status, 204 | 404 | 503), "delete: {status}");
                n += usize::from(status == 204);
            }
            n
        });
        let produce = s.spawn(|| {
            let mut n = 0;
            while Instant::now() < until {
                let r = c
                    .request(2, Method::POST, "/v1/topics/churn/produce")
                    .body(r#"{"old":true}"#)
                    .send()
                    .unwrap();
                let status = r.status().as_u16();
                assert!(matches!(status, 202 | 404), "produce: {status}");
                n += usize::from(status == 202);
            }
            n
        });
        let (created, deleted, produced) =
            (create.join().unwrap(), delete.join().unwrap(), produce.join().unwrap());
        eprintln!("churn: {created} creates, {deleted} deletes, {produced} produces accepted");
        assert!(created > 1 && deleted > 0, "the race never happened");
    });
    // Settle on one live incarnation, then one record through every node.
    let (status, _) = create_topic(&c, 0, "churn", 3);
    assert!(matches!(status, 201 | 409));
    let live = wait_for(
        Duration::from_secs(15),
        "every node shows the same live topic",
        || {
            let views: Vec<Option<Value>> = (0..3)
                .map(|i| {
                    let (status, mut v) = c.get_json(i, "/v1/topics/churn")?;
                    (status == 200).then(|| {
                        v.as_object_mut().unwrap().remove("partition_stats");
                        v
                    })
                })
                .collect();
            (views[0].is_some() && views.iter().all(|v| v == &views[0])).then(|| views[0].clone())
        },
        || c.describe(),
    );
    eprintln!("live topic: {live:?}");
    for i in 0..3 {
        let r = c
            .request(i, Method::POST, "/v1/topics/churn/produce?partition=0")
            .body(format!(r#"{{"final":{i}}}"#))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
    }
    // The three records reach partition 0's owner under the live
    // incarnation, and a consume through any node gets them all; every
    // node's files of the topic, where it has any, are the live
    // incarnation's (the same marker).
    // (Each consume leases what it gets: gather the answers.)
    let mut seen = String::new();
    let got = wait_for(
        Duration::from_secs(15),
        "the last records are consumable through n1",
        || {
            let r = c
                .request(0, Method::GET, "/v1/topics/churn/consume?partition=0&max=100&wait=1s")
                .send()
                .ok()?;
            seen.push_str(&r.text().ok()?);
            (0..3).all(|i| seen.contains(&format!(r#"{{"final":{i}}}"#))).then(|| seen.clone())
        },
        || {
            let lines: Vec<String> = (0..3)
                .flat_map(|i| {
                    let log = c.node(i).log();
                    let id = c.node(i).id.clone();
                    log.lines()
                        .filter(|l| {
                            !l.contains("discarding undispatched")
                                && (l.contains("WARN")
                                    || l.contains("ERROR")
                                    || l.contains("refus"))
                        })
                        .map(|l| format!("{id}: {l}"))
                        .collect::<Vec<_>>()
                })
                .collect();
            let tail = lines.len().saturating_sub(40);
            format!(
                "owners: {:?}\n{}\n{}",
                topic_view(&c, 0, "churn"),
                lines[tail..].join("\n"),
                c.describe()
            )
        },
    );
    eprintln!("partition 0 after the churn: {got}");
    let marker = |i: usize| std::fs::read(c.node(i).data_dir.join("topics/churn/incarnation")).ok();
    let markers: Vec<_> = (0..3).map(marker).collect();
    let live_marker = markers.iter().flatten().next().expect("the owner of partition 0 has it");
    assert!(
        markers.iter().flatten().all(|m| m == live_marker),
        "one live incarnation on disk: {markers:?}"
    );
    for i in 0..3 {
        assert!(!c.node(i).log().contains("panicked"), "{}", c.node(i).log_tail());
    }
}

/// The `draining` flags node `i` lists, by member id.
fn draining(c: &Cluster, i: usize) -> Option<Vec<(String, bool)>> {
    let (status, v) = c.get_json(i, "/v1/cluster/members")?;
    (status == 200).then(|| {
        v["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["id"].as_str().unwrap().to_owned(), m["draining"] == true))
            .collect()
    })
}

#[test]
fn a_drained_member_gets_no_new_partitions_is_emptied_and_an_undrain_restores_its_share() {
    let c = Cluster::start(3, ClusterOpts::dev());
    let leader = c.leader(READY);
    let via = follower(&c, leader);
    let before = c.create_placed(leader, json!({"name": "before", "partitions": 6}));
    let on_n3 = before.iter().filter(|o| *o == "n3").count();
    assert!(on_n3 > 0, "n3 owns some partitions of {before:?}");

    let decommission = |i: usize, method: Method, id: &str| {
        let path = format!("/v1/cluster/members/{id}/decommission");
        let r = c.request(i, method, &path).send().unwrap();
        (r.status().as_u16(), r.text().unwrap())
    };
    // Through a follower: the mark is a metastore command, so every
    // replica shows it (the heartbeats that follow keep it).
    assert_eq!(decommission(via, Method::POST, "n3").0, 204);
    let want = vec![("n1".to_owned(), false), ("n2".to_owned(), false), ("n3".to_owned(), true)];
    wait_for(
        Duration::from_secs(15),
        "every node lists n3 draining",
        || (0..3).all(|i| draining(&c, i).as_ref() == Some(&want)).then_some(()),
        || c.describe(),
    );
    let (status, body) = decommission(via, Method::POST, "n9");
    assert_eq!((status, body.contains("member not found")), (404, true), "{body}");
    assert!(
        c.node(via).log().contains("cluster.decommission"),
        "the decommission is audited where it was asked"
    );

    // No new partition lands on n3, and the planner moves every one of its
    // partitions away: n3 ends owning nothing, on every node's replica.
    let after = c.create_placed(leader, json!({"name": "after", "partitions": 6}));
    assert!(after.iter().all(|o| o != "n3"), "{after:?}");
    let started = Instant::now();
    wait_for(
        Duration::from_secs(120),
        "n3 drained: it owns no partition and no move is in flight",
        || {
            (0..3)
                .all(|i| {
                    let n3 = c.get_json(i, "/v1/cluster/members").and_then(|(_, m)| {
                        m["members"].as_array()?.iter().find(|m| m["id"] == "n3").cloned()
                    });
                    let idle = c
                        .get_json(i, "/v1/cluster/moves")
                        .is_some_and(|(_, v)| v["moves"] == json!([]));
                    idle && n3.is_some_and(|m| m["owned_partitions"] == 0)
                })
                .then_some(())
        },
        || c.describe(),
    );
    eprintln!("n3 drained of {on_n3} partitions in {:?}", started.elapsed());
    let (_, plan) = c.get_json(leader, "/v1/cluster/rebalance").unwrap();
    assert_eq!(plan["receivers"], json!(["n1", "n2"]), "{plan}");
    assert_eq!(plan["moves"], json!([]), "{plan}");

    // Cancel: n3 receives partitions again.
    assert_eq!(decommission(via, Method::DELETE, "n3").0, 204);
    let want: Vec<(String, bool)> = want.into_iter().map(|(id, _)| (id, false)).collect();
    wait_for(
        Duration::from_secs(15),
        "every node lists n3 not draining",
        || (0..3).all(|i| draining(&c, i).as_ref() == Some(&want)).then_some(()),
        || c.describe(),
    );
    let again = c.create_placed(leader, json!({"name": "again", "partitions": 6}));
    assert!(again.iter().any(|o| o == "n3"), "{again:?}");
    // And the planner gives n3 its share of the older topics back.
    wait_for(
        Duration::from_secs(120),
        "n3 holds 6 of the 18 partitions again",
        || {
            let (_, m) = c.get_json(leader, "/v1/cluster/members")?;
            let n3 = m["members"].as_array()?.iter().find(|m| m["id"] == "n3")?.clone();
            (n3["owned_partitions"] == 6).then_some(())
        },
        || c.describe(),
    );
}

/// Node ids listed under `key` (`voters` or `learners`) of node `i`'s
/// control plane status, sorted.
fn raft_ids(c: &Cluster, i: usize, key: &str) -> Option<Vec<String>> {
    let s = c.status(i)?;
    let mut ids: Vec<String> =
        s[key].as_array()?.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect();
    ids.sort();
    Some(ids)
}

/// SPEC §7.3 "Decommission": the drained member leaves the Raft voters
/// (4 voters: 3 stay), its leadership handed over first; it stays a
/// learner that still takes produces; an undrain makes it a voter again.
#[test]
fn a_drained_leader_hands_over_and_leaves_the_voters_and_an_undrain_makes_it_vote_again() {
    let c = Cluster::start(4, ClusterOpts::dev());
    let leader = c.leader(READY);
    let drained = c.node(leader).id.clone();
    let others: Vec<usize> = (0..4).filter(|&i| i != leader).collect();
    let all: Vec<String> = (0..4).map(|i| c.node(i).id.clone()).collect();
    let owners = c.create_placed(leader, json!({"name": "t", "partitions": 8}));
    assert!(owners.contains(&drained), "the leader owns partitions of {owners:?}");

    let started = Instant::now();
    let path = format!("/v1/cluster/members/{drained}/decommission");
    let r = c.request(others[0], Method::POST, &path).send().unwrap();
    assert_eq!(r.status().as_u16(), 204);
    let rest: Vec<String> = all.iter().filter(|id| **id != drained).cloned().collect();
    wait_for(
        Duration::from_secs(120),
        &format!("{drained} drained, a learner, and another node leads"),
        || {
            others
                .iter()
                .all(|&i| {
                    let s = c.status(i);
                    let leads_elsewhere = s
                        .as_ref()
                        .is_some_and(|s| s["leader"].as_str().is_some_and(|l| l != drained));
                    leads_elsewhere
                        && raft_ids(&c, i, "voters").as_ref() == Some(&rest)
                        && raft_ids(&c, i, "learners") == Some(vec![drained.clone()])
                })
                .then_some(())
        },
        || c.describe(),
    );
    eprintln!("{drained} (the leader) drained and out of the voters in {:?}", started.elapsed());
    let log = c.node(leader).log();
    assert!(log.contains("handing leadership over"), "the drained leader handed over");

    // A learner still takes produces (its WAL, then the owners' commits).
    let r = c.request(leader, Method::POST, "/v1/topics/t/produce").body("after").send().unwrap();
    assert_eq!(r.status().as_u16(), 202, "{}", r.text().unwrap());

    // Undrain: it votes again.
    let r = c.request(others[1], Method::DELETE, &path).send().unwrap();
    assert_eq!(r.status().as_u16(), 204);
    let started = Instant::now();
    wait_for(
        Duration::from_secs(60),
        &format!("{drained} a voter again"),
        || {
            others
                .iter()
                .all(|&i| {
                    raft_ids(&c, i, "voters").as_ref() == Some(&all)
                        && raft_ids(&c, i, "learners") == Some(vec![])
                })
                .then_some(())
        },
        || c.describe(),
    );
    eprintln!("{drained} a voter again {:?} after the undrain", started.elapsed());
}
