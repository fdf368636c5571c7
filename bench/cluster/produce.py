#!/usr/bin/env python3
"""The produce path through a 3-node narad cluster against one node (issue 24).

In one run, on loopback: a single `narad serve --dev` node, then a fresh
3-node cluster (both release builds, fresh data dirs under a temp dir).
Against each, with 1 KiB messages and a topic of 6 partitions:
  * durable single produce and batch produce (100 records a request),
    `narad bench produce --json`, clients spread over every node of the
    cluster (`--url A,B,C`);
  * the CPU the server processes used per message (the sum over the nodes
    of utime + stime from /proc, divided by the messages acked).
Prints the figures and the cluster/single ratios against issue 24's
targets (msgs/s and MB/s >= 0.5 x single).
Then (phase `remote`), in a fresh 3-node cluster, every message produced
to partition 0 of a topic (`--partition 0`):
  * every client on the partition's owner (local commits) against every
    client on another node (remote commits), single and batch: the CPU of
    all three nodes per message, remote against local (target <= 2 x);
  * produce -> consumable p50/p99 at a fixed rate (`narad bench flow
    --rate`): producers on the owner or on another node with consumers on
    the owner, and producers on one non-owner with consumers on the other
    ("elsewhere": queue-mode consume through a node not owning the partition).
Usage: bench/cluster/produce.py [--binary target/release/narad]
       [--secs 8] [--clients 16] [--rate 2000] [--phases spread,remote]
       [--secret S]  (every node gets NARAD_CLUSTER_SECRET=S: node RPC authenticated)
Every process it starts is killed by PID at the end.
"""
import argparse, json, os, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from metadata import Cluster, cpu_ticks, req  # noqa: E402


def placed(c, topic, n):
    end = time.time() + 30
    while time.time() < end:
        status, body = req(c.url(0, f"/v1/topics/{topic}"))
        if status == 200:
            stats = json.loads(body)["partition_stats"]
            if all(p.get("owner_node") for p in stats):
                return
        time.sleep(0.1)
    raise SystemExit(f"{topic}: partitions not placed")


def all_members(c):
    end = time.time() + 30
    while time.time() < end:
        status, body = req(c.url(0, "/v1/cluster/members"))
        if status == 200 and sum(m["status"] == "alive" for m in json.loads(body)["members"]) == len(c.ids):
            return
        time.sleep(0.1)
    raise SystemExit("not every node is an alive member")


def owner_of(c, topic):
    """The index of the node owning partition 0 of `topic`."""
    status, body = req(c.url(0, f"/v1/topics/{topic}"))
    return c.ids.index(json.loads(body)["partition_stats"][0]["owner_node"])


def cpu_run(binary, c, urls, topic, partitions, batch, secs, clients, command="produce", extra=()):
    """One `narad bench` run against `urls`, with the CPU all server
    processes used per message. Dirty pages of the runs before are written
    back first, so no run pays for another's writeback."""
    os.sync()
    ticks0 = sum(cpu_ticks(p.pid) for p in c.procs)
    out = subprocess.run([binary, "bench", command, "--url", urls, "--topic", topic,
                          "--partitions", str(partitions), "--message-bytes", "1024", "-c", str(clients),
                          "--batch", str(batch), "--duration", f"{secs}s", "--warmup", "1s", "--json", *extra],
                         capture_output=True, text=True, timeout=secs + 60)
    if out.returncode != 0:
        raise SystemExit(f"bench failed: {out.stderr}")
    # A 202 is the ingress WAL's: commits may still be running when the
    # load stops. The CPU counts until every node's dispatch backlog is
    # empty, so the commits of the measured messages are in it.
    drained = time.time()
    fig = json.loads(out.stdout.strip().splitlines()[-1])
    fig["drain_s"] = wait_drained(c) - drained
    ticks = sum(cpu_ticks(p.pid) for p in c.procs) - ticks0
    msgs = fig.get("messages", fig.get("produce_messages", 0))
    # The CPU covers the whole run (the 1 s warm-up included) and the
    # messages only the measured window: an overestimate of the same share
    # for every run, so the ratios hold.
    fig["server_cpu_us_per_msg"] = ticks / os.sysconf("SC_CLK_TCK") * 1e6 / max(msgs, 1)
    return fig


def wait_drained(c, timeout=300):
    """When every node's ingress dispatch backlog is empty."""
    end = time.time() + timeout
    while time.time() < end:
        backlog = 0
        for i in range(len(c.ids)):
            status, body = req(c.url(i, "/metrics"))
            for line in body.decode(errors="replace").splitlines():
                if line.startswith("narad_ingress_dispatch_backlog_records "):
                    backlog += float(line.split()[1])
        if backlog == 0:
            return time.time()
        time.sleep(0.05)
    raise SystemExit("the dispatch backlog did not drain")


def create(c, topic, partitions):
    status, body = req(c.url(0, "/v1/topics"), "POST", json.dumps({"name": topic, "partitions": partitions}))
    if status not in (201, 409):
        raise SystemExit(f"create {topic}: {status} {body!r}")
    placed(c, topic, partitions)


def table(head, figs):
    print(f"{head:<18}{'msgs/s':>10}{'MB/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'CPU us/msg':>12}{'drain s':>9}")
    for (a, b), f in figs.items():
        print(f"{a + ' ' + b:<18}{f.get('msgs_per_sec', 0):>10.0f}{f.get('mb_per_sec', 0):>8.1f}"
              f"{f.get('p50_ms', 0):>8.2f}{f.get('p99_ms', 0):>8.2f}{f['server_cpu_us_per_msg']:>12.1f}"
              f"{f['drain_s']:>9.2f}")


def spread(a, results):
    """Single and batch produce, clients spread over every node, against
    one node."""
    for name, n in [("single", 1), ("cluster", 3)]:
        c = Cluster(a.binary, n, env=a.env)
        try:
            if n > 1:
                all_members(c)
            urls = ",".join(f"http://127.0.0.1:{p}" for p in c.http)
            for shape, batch in [("single", 1), ("batch", 100)]:
                topic = f"p-{shape}"
                create(c, topic, 6)
                results[(name, shape)] = cpu_run(a.binary, c, urls, topic, 6, batch, a.secs, a.clients)
                req(c.url(0, f"/v1/topics/{topic}"), "DELETE")
        finally:
            c.close()
    table("run", results)
    for shape in ["single", "batch"]:
        s, k = results[("single", shape)], results[("cluster", shape)]
        r = k.get("msgs_per_sec", 0) / max(s.get("msgs_per_sec", 1), 1)
        cpu = k["server_cpu_us_per_msg"] / max(s["server_cpu_us_per_msg"], 1e-9)
        print(f"{shape}: cluster/single msgs/s {r:.2f} (target >= 0.5); CPU per message {cpu:.2f}x")


def remote(a):
    """In one 3-node cluster, every message to partition 0 of a topic: every client on its
    owner (each commit local) against every client on another node (each
    commit remote); same clients, same WAL grouping, CPU of all three
    nodes per message. Then produce -> consumable at a fixed rate through
    each, consumers on the owner."""
    c = Cluster(a.binary, 3, env=a.env)
    try:
        all_members(c)
        figs = {}
        for shape, batch in [("single", 1), ("batch", 100)]:
            topic = f"r-{shape}"
            for where in ["local", "remote"]:
                create(c, topic, 3)
                o = owner_of(c, topic)
                i = o if where == "local" else (o + 1) % 3
                figs[(shape, where)] = cpu_run(a.binary, c, f"http://127.0.0.1:{c.http[i]}", topic, 3,
                                               batch, a.secs, a.clients, extra=("--partition", "0"))
                # Gigabytes of records: deleted once measured.
                req(c.url(0, f"/v1/topics/{topic}"), "DELETE")
        table("commit", figs)
        for shape in ["single", "batch"]:
            r = figs[(shape, "remote")]["server_cpu_us_per_msg"] / max(figs[(shape, "local")]["server_cpu_us_per_msg"], 1e-9)
            print(f"{shape}: remote-commit CPU per record {r:.2f}x local (target <= 2)")
        topic = "r-latency"
        lat = {}
        # "elsewhere": produced through one non-owner, consumed through the
        # other (queue-mode consume through any node, issue 36).
        for where in ["local", "remote", "elsewhere"]:
            create(c, topic, 3)
            o = owner_of(c, topic)
            i = o if where == "local" else (o + 1) % 3
            k = (o + 2) % 3 if where == "elsewhere" else o
            lat[where] = cpu_run(a.binary, c, f"http://127.0.0.1:{c.http[i]}", topic, 3, 1, a.secs, 4, "flow",
                                 ("--partition", "0", "--rate", str(a.rate), "--consumers", "2", "--consume-batch", "100",
                                  "--consume-url", f"http://127.0.0.1:{c.http[k]}"))
            req(c.url(0, f"/v1/topics/{topic}"), "DELETE")
        for where, f in lat.items():
            if "e2e_p50_ms" not in f:
                raise SystemExit(f"{where}: no produce -> consume figures: {f}")
            print(f"produce -> consumable, {where}, {a.rate} msgs/s: p50 {f['e2e_p50_ms']:.2f} ms, "
                  f"p99 {f['e2e_p99_ms']:.2f} ms ({f['e2e_samples']:.0f} samples)")
    finally:
        c.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/release/narad")
    ap.add_argument("--secs", type=int, default=8)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--rate", type=int, default=2000, help="produce rate of the latency runs")
    ap.add_argument("--phases", default="spread,remote")
    ap.add_argument("--secret", help="NARAD_CLUSTER_SECRET of every node (node RPC authenticated)")
    a = ap.parse_args()
    a.env = {"NARAD_CLUSTER_SECRET": a.secret} if a.secret else {}
    phases = a.phases.split(",")
    if "spread" in phases:
        spread(a, {})
    if "remote" in phases:
        remote(a)


if __name__ == "__main__":
    main()
