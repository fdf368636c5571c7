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
targets (msgs/s and MB/s >= 0.5 x single; CPU per message <= 2 x).
Usage: bench/cluster/produce.py [--binary target/release/narad]
       [--secs 8] [--clients 16]
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


def run(binary, c, topic, batch, secs, clients):
    urls = ",".join(f"http://127.0.0.1:{p}" for p in c.http)
    ticks0 = sum(cpu_ticks(p.pid) for p in c.procs)
    out = subprocess.run([binary, "bench", "produce", "--url", urls, "--topic", topic,
                          "--partitions", "6", "--message-bytes", "1024", "-c", str(clients),
                          "--batch", str(batch), "--duration", f"{secs}s", "--warmup", "1s", "--json"],
                         capture_output=True, text=True, timeout=secs + 60)
    ticks = sum(cpu_ticks(p.pid) for p in c.procs) - ticks0
    if out.returncode != 0:
        raise SystemExit(f"bench failed: {out.stderr}")
    fig = json.loads(out.stdout.strip().splitlines()[-1])
    # The CPU covers the whole run (the 1 s warm-up included) and the
    # messages only the measured window: an overestimate of the same share
    # for both runs, so the ratio holds.
    fig["server_cpu_us_per_msg"] = ticks / os.sysconf("SC_CLK_TCK") * 1e6 / max(fig.get("messages", 0), 1)
    return fig


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/release/narad")
    ap.add_argument("--secs", type=int, default=8)
    ap.add_argument("--clients", type=int, default=16)
    a = ap.parse_args()
    results = {}
    for name, n in [("single", 1), ("cluster", 3)]:
        c = Cluster(a.binary, n)
        try:
            if n > 1:
                all_members(c)
            for shape, batch in [("single", 1), ("batch", 100)]:
                topic = f"p-{shape}"
                status, body = req(c.url(0, "/v1/topics"), "POST",
                                   json.dumps({"name": topic, "partitions": 6}))
                if status not in (201, 409):
                    raise SystemExit(f"create {topic}: {status} {body!r}")
                placed(c, topic, 6)
                results[(name, shape)] = run(a.binary, c, topic, batch, a.secs, a.clients)
        finally:
            c.close()
    print(f"{'run':<18}{'msgs/s':>10}{'MB/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'CPU us/msg':>12}")
    for (name, shape), f in results.items():
        print(f"{name + ' ' + shape:<18}{f.get('msgs_per_sec', 0):>10.0f}{f.get('mb_per_sec', 0):>8.1f}"
              f"{f.get('p50_ms', 0):>8.2f}{f.get('p99_ms', 0):>8.2f}{f['server_cpu_us_per_msg']:>12.1f}")
    for shape in ["single", "batch"]:
        s, k = results[("single", shape)], results[("cluster", shape)]
        r = k.get("msgs_per_sec", 0) / max(s.get("msgs_per_sec", 1), 1)
        cpu = k["server_cpu_us_per_msg"] / max(s["server_cpu_us_per_msg"], 1e-9)
        print(f"{shape}: cluster/single msgs/s {r:.2f} (target >= 0.5); CPU per message {cpu:.2f}x (target <= 2)")


if __name__ == "__main__":
    main()
