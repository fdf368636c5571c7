#!/usr/bin/env python3
"""Control-plane figures of a 3-node narad cluster on loopback (issue 23).

Starts three `narad serve --dev` nodes (peers on loopback, fresh data dirs
under a temp dir), then prints:
  * create-topic latency p50/p99 through the leader and through a follower;
  * time from `kill -9` of the leader to the next successful create through
    a survivor (median of N trials; the killed node is restarted between
    trials);
  * catch-up time of a node that was stopped while K commands committed;
  * idle CPU (% of one core over 30 s) and RSS of each node of a fresh
    cluster holding T topics x 3 partitions (one 1 KiB record per
    partition, produced through its owner), and of a single node with the
    same load, and the worst node's ratio to the single node.
Usage: bench/cluster/metadata.py [--binary target/release/narad]
       [--creates 300] [--trials 10] [--behind 10000] [--topics 1000]
       [--phases latency,failover,catchup,idle]
Every process it starts is killed by PID at the end.
"""
import argparse, json, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, time
import urllib.request

def free_port(kind=socket.SOCK_STREAM):
    s = socket.socket(socket.AF_INET, kind); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def req(url, method="GET", body=None, timeout=30):
    r = urllib.request.Request(url, method=method, data=body.encode() if body else None)
    try:
        with urllib.request.urlopen(r, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except Exception as e:
        return 0, str(e).encode()

class Cluster:
    def __init__(self, binary, n=3, env=None, start=None):
        """n nodes n1..nN, all named in NARAD_CLUSTER_PEERS; only the first
        `start` (default: all) are started (spawn(i) starts the others later:
        a node joining, with NARAD_CLUSTER_INITIAL_MEMBERS in `env`)."""
        self.binary, self.root = binary, tempfile.mkdtemp(prefix="narad-bench-cluster-")
        self.env = dict(env or {})
        self.http = [free_port() for _ in range(n)]
        self.udp = [free_port(socket.SOCK_DGRAM) for _ in range(n)]
        self.ids = [f"n{i+1}" for i in range(n)]
        self.peers = ",".join(f"{self.ids[i]}@127.0.0.1:{self.udp[i]}" for i in range(n))
        self.procs = [None] * n
        start = n if start is None else start
        for i in range(start): self.spawn(i)
        for i in range(start): self.wait_ready(i)
    def spawn(self, i, extra_env=None):
        cluster = dict(NARAD_CLUSTER_PEERS=self.peers, NARAD_NODE_ID=self.ids[i],
                       NARAD_CLUSTER_ADDR=f"127.0.0.1:{self.udp[i]}") if len(self.ids) > 1 else {}
        env = dict(os.environ, NARAD_LOG_LEVEL="warn", **cluster, **self.env, **(extra_env or {}))
        log = open(os.path.join(self.root, f"{self.ids[i]}.log"), "ab")
        self.procs[i] = subprocess.Popen([self.binary, "serve", "--dev", "--addr", f"127.0.0.1:{self.http[i]}",
                                          "--data-dir", os.path.join(self.root, self.ids[i])], env=env, stdout=log, stderr=log)
    def url(self, i, path): return f"http://127.0.0.1:{self.http[i]}{path}"
    def wait_ready(self, i, timeout=60):
        end = time.time() + timeout
        while time.time() < end:
            if req(self.url(i, "/readyz"), timeout=2)[0] == 200: return
            time.sleep(0.05)
        raise SystemExit(f"{self.ids[i]} not ready")
    def status(self, i):
        c, b = req(self.url(i, "/v1/cluster/status"), timeout=2)
        return json.loads(b) if c == 200 else None
    def leader(self):
        """The node every running node names as leader, and that says it leads."""
        for _ in range(400):
            live = [i for i in range(len(self.ids)) if self.procs[i] and self.procs[i].poll() is None]
            st = {i: self.status(i) for i in live}
            names = {s["leader"] for s in st.values() if s}
            if len(names) == 1 and all(st.values()):
                name = names.pop()
                i = self.ids.index(name) if name in self.ids else None
                if i is not None and st.get(i) and st[i]["role"] == "leader": return i
            time.sleep(0.05)
        raise SystemExit("no agreed leader")
    def kill9(self, i): self.procs[i].send_signal(signal.SIGKILL); self.procs[i].wait()
    def close(self):
        for p in self.procs:
            if p and p.poll() is None: p.kill(); p.wait()
        shutil.rmtree(self.root, ignore_errors=True)

def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"): return int(line.split()[1])
def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f: parts = f.read().rsplit(")", 1)[1].split()
    return int(parts[11]) + int(parts[12])

def pct(xs, q): xs = sorted(xs); return xs[min(len(xs) - 1, int(q * len(xs)))]

def idle_figures(procs, settle=15, window=30):
    """(cpu % of one core over `window` s, RSS MiB) of each process."""
    time.sleep(settle)
    t0 = [cpu_ticks(p.pid) for p in procs]; time.sleep(window); t1 = [cpu_ticks(p.pid) for p in procs]
    hz = os.sysconf("SC_CLK_TCK")
    return [((t1[k] - t0[k]) / hz / window * 100, rss_kb(p.pid) / 1024) for k, p in enumerate(procs)]

def load_topics(c, n, via_owner):
    """n topics x 3 partitions, one 1 KiB record per partition (through the
    partition's owner when via_owner, as the cross-node path will commit)."""
    body = json.dumps({"pad": "x" * 1000})
    for k in range(n):
        code, _ = req(c.url(0, "/v1/topics"), "POST", json.dumps({"name": f"idle-{k}", "partitions": 3}))
        assert code == 201, code
    for k in range(n):
        code, b = req(c.url(0, f"/v1/topics/idle-{k}"))
        for p in json.loads(b)["partition_stats"]:
            node = c.ids.index(p["owner_node"]) if via_owner else 0
            code, _ = req(c.url(node, f"/v1/topics/idle-{k}/produce?partition={p['index']}"), "POST", body)
            assert code == 202, code

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/release/narad")
    ap.add_argument("--creates", type=int, default=300)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--behind", type=int, default=10000)
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--phases", default="latency,failover,catchup,idle",
                    help="comma-separated subset of latency,failover,catchup,idle")
    a = ap.parse_args()
    phases = set(a.phases.split(","))
    binary = os.path.abspath(a.binary)
    if phases & {"latency", "failover", "catchup"}:
        c = Cluster(binary)
        try:
            if "latency" in phases:
                L = c.leader(); F = (L + 1) % 3
                for name, node in (("leader", L), ("follower", F)):
                    lat = []
                    for k in range(a.creates):
                        t = time.perf_counter(); code, _ = req(c.url(node, "/v1/topics"), "POST", json.dumps({"name": f"lat-{name}-{k}", "partitions": 3}))
                        lat.append((time.perf_counter() - t) * 1000)
                        assert code == 201, code
                    print(f"create_topic_via_{name}: n={a.creates} p50={pct(lat,.5):.2f} ms p99={pct(lat,.99):.2f} ms", flush=True)
            if "failover" in phases:
                fail = []
                for trial in range(a.trials):
                    L = c.leader(); S = (L + 1) % 3
                    c.kill9(L); t = time.perf_counter()
                    while True:
                        code, _ = req(c.url(S, "/v1/topics"), "POST", json.dumps({"name": f"failover-{trial}"}), timeout=10)
                        if code == 201: break
                        time.sleep(0.02)
                    fail.append(time.perf_counter() - t)
                    print(f"  trial {trial}: killed leader {c.ids[L]}, create through {c.ids[S]} ok after {fail[-1]:.2f} s", flush=True)
                    c.spawn(L); c.wait_ready(L)
                print(f"kill9_leader_to_next_create: trials={a.trials} median={statistics.median(fail):.2f} s min={min(fail):.2f} s max={max(fail):.2f} s", flush=True)
            if "catchup" in phases:
                L = c.leader(); B = (L + 1) % 3
                c.procs[B].send_signal(signal.SIGTERM); c.procs[B].wait()
                for k in range(a.behind):
                    code, _ = req(c.url(L, "/v1/topics"), "POST", json.dumps({"name": f"behind-{k}", "partitions": 3}))
                    assert code == 201, code
                target = c.status(L)["commit_index"]
                t = time.perf_counter(); c.spawn(B)
                while True:
                    s = c.status(B)
                    if s and s["applied_index"] >= target: break
                    time.sleep(0.02)
                print(f"catch_up: behind={a.behind} creates (raft index {target}) caught up in {time.perf_counter()-t:.2f} s (process start included)", flush=True)
        finally:
            c.close()
    if "idle" in phases:
        # A fresh cluster holding exactly --topics topics, then a single node
        # with the same load, so the two compare.
        c = Cluster(binary)
        try:
            load_topics(c, a.topics, via_owner=True)
            figs = idle_figures(c.procs)
            for k, (cpu, rss) in enumerate(figs):
                print(f"idle_cluster_{c.ids[k]}: topics={a.topics} x3 cpu={cpu:.2f}% rss={rss:.1f} MiB", flush=True)
        finally:
            c.close()
        one = Cluster(binary, n=1)
        try:
            load_topics(one, a.topics, via_owner=False)
            (cpu1, rss1), = idle_figures(one.procs)
            print(f"idle_single_node: topics={a.topics} x3 cpu={cpu1:.2f}% rss={rss1:.1f} MiB", flush=True)
        finally:
            one.close()
        worst_cpu = max(f[0] for f in figs); worst_rss = max(f[1] for f in figs)
        print(f"idle_ratio_worst_node_vs_single: cpu={worst_cpu/max(cpu1,0.01):.2f}x rss={worst_rss/rss1:.2f}x (target <= 2x)", flush=True)

if __name__ == "__main__":
    main()
