#!/usr/bin/env python3
"""Partition moves on loopback: issue 37's three figures, in one run.

Every cluster is release `narad serve --dev` nodes on loopback (fresh data
dirs under one temp dir, on the same filesystem as the disk probe). Phases:

  * disk: the disk's sequential write rate where the nodes keep their data:
    `dd if=/dev/zero bs=4M conv=fdatasync` (buffered writes, one fdatasync
    at the end: what a move's copy does, which fdatasyncs once before it
    installs) and `dd bs=1M oflag=dsync` (a sync per MiB, as
    ../shared/bench/README.md measured it), both of --fill-mib.
  * copy: a 3-node cluster, a 4-partition topic (topics have at least 3;
    placed 2, 1, 1), one partition of the node holding two filled with
    --fill-mib of 1 KiB records (`narad bench produce --partition P
    --batch 100` through its owner), every dispatch backlog 0 and `sync`, then
    `POST /v1/cluster/moves` to a node holding one, with no load (after
    it the counts are 1, 2, 1: the planner has nothing to move back). Throughput =
    `narad_moves_bytes_total` / `narad_moves_duration_seconds_sum` on the
    destination (the mover's own start to the flip), cross-checked with the
    wall time from the POST to the owner flip seen in `GET /v1/topics/{t}`;
    the destination's `progress.phase` is polled every 50 ms, so the time
    in copy rounds, frozen tail and install/verify/flip is split.
    Ratio against the dd fdatasync rate (target >= 0.5).
  * stall: a fresh 3-node cluster, the same layout, the partition (on A) filled
    with --stall-mib (16 KiB records) and drained by a consumer; then this
    script's own open-loop producer (--rate single produces of 1 KiB a
    second, each payload carrying its send time) and one long-polling
    consumer (`max=100`, batch ack), both through the third node C, so
    every commit is remote before and after the move. After --baseline s
    the partition is moved from A to B. Produce -> consumable (send time to
    the consume answer that delivered it) p50/p99/max of the records sent
    during the move (POST to owner flip seen), during the freeze (first
    poll showing phase frozen to the flip) and of the --baseline s before
    the POST. Target: p99 of the move window <= 1 s.
  * rebalance: a 4-node cluster (NARAD_CLUSTER_INITIAL_MEMBERS=n1,n2,n3)
    with n1..n3 started, a 12-partition topic filled with --rb-mib per
    partition, then `narad bench produce` (--clients, --batch, 1 KiB)
    against n1..n3 while this script samples the sum of
    `narad_ingress_wal_records_total` on n1..n3 every 0.25 s. After
    --steady s, n4 is started (it joins; the planner moves partitions to
    it). Throughput over the rebalance window (first move listed in
    `GET /v1/cluster/moves` until none is) against the --steady s before
    n4 started (target >= 0.7).

Usage: bench/cluster/moves.py [--binary target/release/narad]
       [--fill-mib 512] [--stall-mib 48] [--rate 500] [--baseline 15]
       [--rb-mib 64] [--steady 20] [--clients 16] [--batch 1]
       [--phases disk,copy,stall,rebalance] [--secret S] [--perf FILE]
Every process it starts is killed by PID at the end; the temp dirs are
removed.
"""
import argparse, http.client, json, os, re, shutil, signal, subprocess, sys, tempfile, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from metadata import Cluster, cpu_ticks, req  # noqa: E402
from produce import create, wait_drained  # noqa: E402

MB = 1e6


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def metrics(c, i):
    """Node i's /metrics as {name{labels}: value}."""
    code, body = req(c.url(i, "/metrics"), timeout=5)
    out = {}
    if code != 200:
        return out
    for line in body.decode(errors="replace").splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out


def moves_metrics(c, i):
    m = metrics(c, i)
    return {"bytes": m.get("narad_moves_bytes_total", 0.0),
            "secs": m.get("narad_moves_duration_seconds_sum", 0.0),
            "count": m.get("narad_moves_duration_seconds_count", 0.0),
            "completed": m.get('narad_moves_total{outcome="completed"}', 0.0),
            "aborted": m.get('narad_moves_total{outcome="aborted"}', 0.0)}


def get_json(c, i, path, timeout=5):
    code, body = req(c.url(i, path), timeout=timeout)
    if code != 200:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def wait_alive(c, k, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        m = get_json(c, 0, "/v1/cluster/members")
        if m and sum(x["status"] == "alive" for x in m["members"]) >= k:
            return
        time.sleep(0.1)
    raise SystemExit(f"fewer than {k} alive members")


def bench(binary, args, timeout):
    out = subprocess.run([binary, "bench", *args, "--json"], capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise SystemExit(f"narad bench {' '.join(args)} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def fill(a, c, node, topic, partitions, count, message_bytes, partition=None):
    """Batch produce `count` records through `node`, then wait until every
    dispatch backlog is empty and sync the page cache."""
    t = time.time()
    args = ["produce", "--url", ",".join(c.url(i, "") for i in node), "--topic", topic,
            "--partitions", str(partitions), "--message-bytes", str(message_bytes), "-c", "8",
            "--batch", "100", "--count", str(count)]
    if partition is not None:
        args += ["--partition", str(partition)]
    bench(a.binary, args, timeout=1800)
    wait_drained(c, timeout=1800)
    os.sync()
    return time.time() - t


def partition_stats(c, i, topic):
    t = get_json(c, i, f"/v1/topics/{topic}")
    return t["partition_stats"] if t else None


def pick(c, topic):
    """In a 4-partition topic on 3 nodes (2, 1, 1 partitions), the first
    partition of the node holding two, a node holding one (the
    destination: after the move the counts are 1, 2, 1, so the planner has
    nothing to move back) and the third node."""
    stats = partition_stats(c, 0, topic)
    owners = [c.ids.index(p["owner_node"]) for p in stats]
    counts = {i: owners.count(i) for i in range(3)}
    src = max(counts, key=lambda i: (counts[i], -i))
    part = owners.index(src)
    dst = min((i for i in range(3) if i != src), key=lambda i: (counts[i], i))
    other = 3 - src - dst
    return part, src, dst, other


def move(c, via, topic, partition, to):
    code, body = req(c.url(via, "/v1/cluster/moves"), "POST",
                     json.dumps({"topic": topic, "partition": partition, "to": c.ids[to]}))
    if code != 202:
        raise SystemExit(f"POST /v1/cluster/moves: {code} {body!r}")


def watch_move(c, dest, topic, partition, t0, timeout=900):
    """Polls the destination's progress and the owner every 50 ms until the
    owner is `dest` and the destination runs no move; the timeline
    [(t - t0, phase, rounds, bytes_copied, bytes_total)] and the flip time
    (seconds after t0)."""
    timeline, flip, end, gone = [], None, time.time() + timeout, None
    want = c.ids[dest]
    while time.time() < end:
        mv = get_json(c, dest, "/v1/cluster/moves", timeout=2)
        now = time.time()
        prog = None
        if mv:
            for m in mv.get("moves", []):
                if m.get("topic") == topic and m.get("partition") == partition and m.get("progress"):
                    prog = m["progress"]
        if prog:
            timeline.append((now - t0, prog["phase"], prog["rounds"], prog["bytes_copied"], prog["bytes_total"],
                             prog["age_ms"]))
            gone = None
        elif timeline and flip is None:
            gone = gone or now
            if now - gone > 5:
                raise SystemExit(f"{topic}/{partition}: the move ended without a flip to {want} (aborted?)")
        if flip is None:
            stats = partition_stats(c, dest, topic)
            if stats and stats[partition].get("owner_node") == want:
                flip = time.time() - t0
        if flip is not None and not prog:
            return timeline, flip
        time.sleep(0.05)
    raise SystemExit(f"{topic}/{partition}: no flip to {want} within {timeout} s")


def phase_spans(timeline, flip):
    """First time each phase was seen, and the flip: {phase: (from, to)}."""
    firsts = []
    for t, ph, *_ in timeline:
        if not firsts or firsts[-1][1] != ph:
            firsts.append((t, ph))
    spans = {}
    for k, (t, ph) in enumerate(firsts):
        nxt = firsts[k + 1][0] if k + 1 < len(firsts) else flip
        a, b = spans.get(ph, (t, nxt))
        spans[ph] = (min(a, t), max(b, nxt))
    return spans


def dd(path, args):
    out = subprocess.run(["dd", "if=/dev/zero", f"of={path}", *args], capture_output=True, text=True)
    os.unlink(path)
    m = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", out.stderr)
    if not m:
        raise SystemExit(f"dd: {out.stderr}")
    return int(m.group(1)) / float(m.group(2)) / MB


def disk(a, res):
    d = tempfile.mkdtemp(prefix="narad-bench-disk-")
    try:
        n = a.fill_mib
        f = os.path.join(d, "seq.probe")
        os.sync()
        res["dd_fdatasync_mb_s"] = dd(f, ["bs=4M", f"count={n // 4}", "conv=fdatasync"])
        res["dd_dsync_mb_s"] = dd(f, ["bs=1M", f"count={n}", "oflag=dsync"])
        print(f"disk ({d}): dd bs=4M count={n // 4} conv=fdatasync {res['dd_fdatasync_mb_s']:.0f} MB/s; "
              f"dd bs=1M count={n} oflag=dsync {res['dd_dsync_mb_s']:.0f} MB/s", flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def rate_env(env, rate):
    """`env` with NARAD_CLUSTER_MOVE_COPY_RATE (None: the node's default)."""
    return env if rate is None else dict(env, NARAD_CLUSTER_MOVE_COPY_RATE=str(rate))


def copy(a, res):
    c = Cluster(a.binary, 3, env=rate_env(a.env, a.copy_rate))
    try:
        wait_alive(c, 3)
        topic = "mv-copy"
        create(c, topic, 4)
        P, o, d, x = pick(c, topic)
        took = fill(a, c, [o], topic, 4, a.fill_mib * 1024, 1024, partition=P)
        before = moves_metrics(c, d)
        print(f"copy: filled {topic}/{P} on {c.ids[o]} with {a.fill_mib * 1024} records of 1 KiB in {took:.1f} s "
              f"(committed, synced); moving it to {c.ids[d]}", flush=True)
        perf = None
        if a.perf:
            # Call graphs of the source and the destination over the move.
            perf = subprocess.Popen(["perf", "record", "-F", "499", "-g", "-o", a.perf, "-p",
                                     f"{c.procs[o].pid},{c.procs[d].pid}"], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            time.sleep(1)
        ticks0 = [cpu_ticks(p.pid) for p in c.procs]
        t0 = time.time()
        move(c, x, topic, P, d)
        timeline, flip = watch_move(c, d, topic, P, t0)
        ticks1 = [cpu_ticks(p.pid) for p in c.procs]
        if perf:
            perf.send_signal(signal.SIGINT)
            perf.wait(timeout=60)
            print(f"  perf record of {c.ids[o]} (pid {c.procs[o].pid}) and {c.ids[d]} (pid {c.procs[d].pid}) "
                  f"in {a.perf}", flush=True)
        after = moves_metrics(c, d)
        hz = os.sysconf("SC_CLK_TCK")
        cpu = {c.ids[i]: (ticks1[i] - ticks0[i]) / hz / flip * 100 for i in range(3)}
        moved = after["bytes"] - before["bytes"]
        secs = after["secs"] - before["secs"]
        spans = phase_spans(timeline, flip)
        res["copy"] = dict(bytes=moved, secs=secs, wall=flip, spans=spans, cpu=cpu,
                           chunk_ms=secs * 1000 / max(moved / (1 << 20), 1),
                           mover_mb_s=moved / MB / secs if secs else 0, wall_mb_s=moved / MB / flip,
                           completed=after["completed"] - before["completed"],
                           aborted=after["aborted"] - before["aborted"])
        r = res["copy"]
        print(f"copy: {moved / MB:.1f} MB moved; mover {secs:.2f} s = {r['mover_mb_s']:.0f} MB/s; "
              f"POST -> flip seen {flip:.2f} s = {r['wall_mb_s']:.0f} MB/s; "
              f"completed {r['completed']:.0f}, aborted {r['aborted']:.0f}", flush=True)
        print(f"  CPU from the POST to the flip (% of one core): source {c.ids[o]} {cpu[c.ids[o]]:.0f}%, "
              f"destination {c.ids[d]} {cpu[c.ids[d]]:.0f}%, third {c.ids[x]} {cpu[c.ids[x]]:.0f}%; "
              f"mover time per 1 MiB chunk {r['chunk_ms']:.1f} ms", flush=True)
        started = timeline[0][0] - timeline[0][5] / 1000 if timeline else float("nan")
        r["mover_started"] = started
        print(f"  the mover started {started:.2f} s after the POST (its age_ms at the first poll)", flush=True)
        for ph, (x, y) in spans.items():
            print(f"  phase {ph:<12} seen {x:7.2f} s .. {y:7.2f} s after the POST ({y - x:.2f} s)", flush=True)
        copying = [e for e in timeline if e[1] == "copying"]
        if len(copying) >= 2:
            (t1, _, _, b1, _, _), (t2, _, rounds, b2, tot, _) = copying[0], copying[-1]
            if t2 > t1:
                print(f"  copy rounds: {(b2 - b1) / MB / (t2 - t1):.0f} MB/s between the first and last poll "
                      f"in phase copying ({rounds} rounds, {b2 / MB:.0f} of {tot / MB:.0f} MB)", flush=True)
    finally:
        c.close()


class Producer(threading.Thread):
    """Open loop: one single produce every 1/rate s through one node, each
    payload `{"ts": send time, "pad": ...}`; a late send goes at once."""

    def __init__(self, port, topic, rate, partition):
        super().__init__(daemon=True)
        self.port, self.topic, self.rate, self.partition = port, topic, rate, partition
        self.stop, self.sent, self.errors = threading.Event(), [], 0

    def run(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        pad = "x" * 950
        t0, k = time.time(), 0
        while not self.stop.is_set():
            due = t0 + k / self.rate
            wait = due - time.time()
            if wait > 0:
                time.sleep(wait)
            k += 1
            ts = time.time()
            body = json.dumps({"ts": ts, "pad": pad})
            try:
                conn.request("POST", f"/v1/topics/{self.topic}/produce?partition={self.partition}", body=body,
                             headers={"content-type": "application/json"})
                r = conn.getresponse()
                r.read()
                if r.status == 202:
                    self.sent.append(ts)
                else:
                    self.errors += 1
            except Exception:
                self.errors += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)


class Consumer(threading.Thread):
    """Long-polls consume (max=100, wait=1s) through one node and acks each
    batch; {send time: consume answer time} of every timed record."""

    def __init__(self, port, topic):
        super().__init__(daemon=True)
        self.port, self.topic = port, topic
        self.stop, self.got, self.other, self.errors = threading.Event(), {}, 0, 0

    def run(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        while not self.stop.is_set():
            try:
                conn.request("GET", f"/v1/topics/{self.topic}/consume?max=100&wait=1000ms")
                r = conn.getresponse()
                body = r.read()
                now = time.time()
                if r.status != 200:
                    self.errors += 1
                    time.sleep(0.05)
                    continue
                msgs = json.loads(body).get("messages", [])
                handles = [m["receipt_handle"] for m in msgs if m.get("receipt_handle")]
                for m in msgs:
                    p = m.get("payload")
                    if isinstance(p, str):
                        try:
                            p = json.loads(p)
                        except ValueError:
                            p = None
                    if isinstance(p, dict) and "ts" in p:
                        self.got.setdefault(p["ts"], now)
                    else:
                        self.other += 1
                if handles:
                    conn.request("POST", f"/v1/topics/{self.topic}/ack", body=json.dumps({"receipt_handles": handles}),
                                 headers={"content-type": "application/json"})
                    conn.getresponse().read()
            except Exception:
                self.errors += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                time.sleep(0.05)


def drain(c, i, topic):
    """Consumes and acks through node i until three empty answers in a row."""
    empty, n = 0, 0
    while empty < 3:
        code, body = req(c.url(i, f"/v1/topics/{topic}/consume?max=100&wait=300ms"))
        msgs = json.loads(body).get("messages", []) if code == 200 else []
        if msgs:
            empty = 0
            n += len(msgs)
            req(c.url(i, f"/v1/topics/{topic}/ack"), "POST",
                json.dumps({"receipt_handles": [m["receipt_handle"] for m in msgs]}))
        else:
            empty += 1
    return n


def lat_row(name, pairs):
    ms = [(cons - ts) * 1000 for ts, cons in pairs]
    if not ms:
        return {"name": name, "n": 0}
    return {"name": name, "n": len(ms), "p50": pct(ms, .5), "p99": pct(ms, .99), "max": max(ms)}


def stall(a, res):
    c = Cluster(a.binary, 3, env=rate_env(a.env, a.copy_rate))
    try:
        wait_alive(c, 3)
        topic = "mv-stall"
        create(c, topic, 4)
        P, o, d, x = pick(c, topic)
        fill(a, c, [o], topic, 4, a.stall_mib * 64, 16384, partition=P)
        drained = drain(c, x, topic)
        print(f"stall: {topic}/{P} on {c.ids[o]} filled with {a.stall_mib * 64} records of 16 KiB and drained "
              f"({drained} consumed); producer and consumer on {c.ids[x]} at {a.rate} msgs/s; "
              f"the move goes to {c.ids[d]}", flush=True)
        cons = Consumer(c.http[x], topic)
        prod = Producer(c.http[x], topic, a.rate, P)
        cons.start()
        prod.start()
        time.sleep(3 + a.baseline)
        t0 = time.time()
        move(c, x, topic, P, d)
        timeline, flip = watch_move(c, d, topic, P, t0)
        time.sleep(5)
        prod.stop.set()
        prod.join()
        sent = list(prod.sent)
        end = time.time() + 30
        while time.time() < end and not all(ts in cons.got for ts in sent):
            time.sleep(0.2)
        cons.stop.set()
        cons.join(timeout=15)
        got = dict(cons.got)
        spans = phase_spans(timeline, flip)
        frozen_from = min((s[0] for ph, s in spans.items() if ph in ("frozen", "installing")), default=None)
        lost = [ts for ts in sent if ts not in got]
        rows = [lat_row(f"baseline ({a.baseline} s before the POST)",
                        [(ts, got[ts]) for ts in sent if t0 - a.baseline <= ts < t0 and ts in got]),
                lat_row("move (POST -> owner flip seen)",
                        [(ts, got[ts]) for ts in sent if t0 <= ts <= t0 + flip and ts in got])]
        if frozen_from is not None:
            rows.append(lat_row("freeze (frozen/installing seen -> flip seen)",
                                [(ts, got[ts]) for ts in sent if t0 + frozen_from <= ts <= t0 + flip and ts in got]))
        rows.append(lat_row("after (flip -> 5 s later)",
                            [(ts, got[ts]) for ts in sent if t0 + flip < ts and ts in got]))
        res["stall"] = dict(rows=rows, spans=spans, flip=flip, lost=len(lost), sent=len(sent),
                            produce_errors=prod.errors, consume_errors=cons.errors)
        print(f"stall: POST -> flip seen {flip:.2f} s; sent {len(sent)} (errors {prod.errors}), "
              f"not consumed {len(lost)}, consume errors {cons.errors}", flush=True)
        if timeline:
            res["stall"]["mover_started"] = timeline[0][0] - timeline[0][5] / 1000
            print(f"  the mover started {res['stall']['mover_started']:.2f} s after the POST", flush=True)
        for ph, (p0, p1) in spans.items():
            print(f"  phase {ph:<12} seen {p0:7.2f} s .. {p1:7.2f} s after the POST ({p1 - p0:.2f} s)", flush=True)
        for r in rows:
            if r["n"]:
                print(f"  {r['name']:<44} n={r['n']:>6} p50 {r['p50']:8.1f} ms  p99 {r['p99']:8.1f} ms  "
                      f"max {r['max']:8.1f} ms", flush=True)
            else:
                print(f"  {r['name']:<44} n=0", flush=True)
    finally:
        c.close()


def rebalance(a, res):
    env = dict(rate_env(a.env, a.rb_copy_rate), NARAD_CLUSTER_INITIAL_MEMBERS="n1,n2,n3")
    c = Cluster(a.binary, 4, env=env, start=3)
    load = None
    try:
        wait_alive(c, 3)
        topic = "mv-rb"
        create(c, topic, 12)
        took = fill(a, c, [0, 1, 2], topic, 12, 12 * a.rb_mib * 1024, 1024)
        print(f"rebalance: {topic} (12 partitions) filled with {a.rb_mib} MiB of 1 KiB records per partition "
              f"in {took:.1f} s; load: {a.clients} clients, batch {a.batch}, on n1..n3", flush=True)
        samples, stop = [], threading.Event()

        def sample():
            while not stop.is_set():
                t = time.time()
                n = sum(metrics(c, i).get("narad_ingress_wal_records_total", 0.0) for i in range(3))
                mv = get_json(c, 0, "/v1/cluster/moves", timeout=2)
                samples.append((t, n, len(mv["moves"]) if mv else -1))
                time.sleep(max(0, 0.25 - (time.time() - t)))

        sampler = threading.Thread(target=sample, daemon=True)
        urls = ",".join(c.url(i, "") for i in range(3))
        load = subprocess.Popen([a.binary, "bench", "produce", "--url", urls, "--topic", topic, "--partitions", "12",
                                 "--message-bytes", "1024", "-c", str(a.clients), "--batch", str(a.batch),
                                 "--duration", "900s", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        sampler.start()
        time.sleep(3)
        t_steady = time.time()
        time.sleep(a.steady)
        t_join = time.time()
        before = moves_metrics(c, 3)
        c.spawn(3)
        c.wait_ready(3)
        t_ready = time.time()
        t_first = t_done = None
        end = time.time() + 600
        while time.time() < end:
            mv = get_json(c, 0, "/v1/cluster/moves", timeout=2)
            n = len(mv["moves"]) if mv else -1
            if n > 0 and t_first is None:
                t_first = time.time()
            if t_first is not None and n == 0:
                stats = partition_stats(c, 0, topic)
                owned = sum(p.get("owner_node") == "n4" for p in stats) if stats else 0
                if owned >= 3:
                    t_done = time.time()
                    break
            time.sleep(0.1)
        if t_done is None:
            raise SystemExit("the rebalance did not finish within 600 s")
        time.sleep(3)
        load.send_signal(signal.SIGINT)
        out, err = load.communicate(timeout=120)
        stop.set()
        sampler.join()
        after = moves_metrics(c, 3)

        def rate(t1, t2):
            pts = [(t, n) for t, n, _ in samples if t1 <= t <= t2]
            if len(pts) < 2:
                return float("nan")
            return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])

        steady = rate(t_steady, t_join)
        during = rate(t_first, t_done)
        joined = rate(t_join, t_done)
        fig = {}
        try:
            fig = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            pass
        # The slowest 1 s of the rebalance window.
        pts = [(t, n) for t, n, _ in samples if t_first - 0.5 <= t <= t_done + 0.5]
        worst = min(((n2 - n1) / (t2 - t1) for (t1, n1), (t2, n2) in zip(pts, pts[4:]) if t2 > t1),
                    default=float("nan"))
        moved = after["bytes"] - before["bytes"]
        res["rebalance"] = dict(steady=steady, during=during, joined=joined, worst=worst,
                                window=t_done - t_first, join_to_first=t_first - t_ready, join_to_done=t_done - t_join,
                                moves=after["completed"] - before["completed"], aborted=after["aborted"] - before["aborted"],
                                bytes=moved, mover_secs=after["secs"] - before["secs"], bench=fig)
        r = res["rebalance"]
        print(f"rebalance: steady {steady:.0f} msgs/s over {t_join - t_steady:.0f} s; n4 ready {t_ready - t_join:.1f} s "
              f"after its start, first move listed {r['join_to_first']:.1f} s later, none left "
              f"{r['window']:.1f} s after that", flush=True)
        print(f"  during the rebalance window {during:.0f} msgs/s ({during / steady:.2f} x steady); "
              f"from n4's start to the end {joined:.0f} msgs/s ({joined / steady:.2f} x); slowest 1 s {worst:.0f} msgs/s",
              flush=True)
        print(f"  n4 ran {r['moves']:.0f} moves (aborted {r['aborted']:.0f}): {moved / MB:.1f} MB in "
              f"{r['mover_secs']:.2f} s of mover time (summed)", flush=True)
        if fig:
            print(f"  narad bench produce over the whole load: {fig.get('msgs_per_sec', 0):.0f} msgs/s, "
                  f"p50 {fig.get('p50_ms', 0):.2f} ms, p99 {fig.get('p99_ms', 0):.2f} ms, errors {fig.get('errors', 0):.0f}",
                  flush=True)
    finally:
        if load and load.poll() is None:
            load.kill()
            load.wait()
        c.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/release/narad")
    ap.add_argument("--fill-mib", type=int, default=512, help="the copy phase's partition (and the dd size)")
    ap.add_argument("--stall-mib", type=int, default=48, help="the stall phase's partition")
    ap.add_argument("--rate", type=int, default=500, help="the stall phase's produce rate")
    ap.add_argument("--baseline", type=int, default=15, help="seconds of the stall phase before the move")
    ap.add_argument("--rb-mib", type=int, default=64, help="MiB per partition of the rebalance phase's topic")
    ap.add_argument("--steady", type=int, default=20, help="seconds of steady load before n4 starts")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1, help="records per produce of the rebalance load")
    ap.add_argument("--phases", default="disk,copy,stall,rebalance")
    ap.add_argument("--perf", help="perf record -g the copy phase's source and destination into this file")
    ap.add_argument("--secret", help="NARAD_CLUSTER_SECRET of every node")
    ap.add_argument("--copy-rate", type=int, default=0,
                    help="cluster.move_copy_rate (bytes/s) of the copy and stall phases (0: no limit, "
                         "the mechanism's own speed)")
    ap.add_argument("--rb-copy-rate", type=int, default=None,
                    help="cluster.move_copy_rate (bytes/s) of the rebalance phase (default: the node's "
                         "default, 32 MiB/s)")
    a = ap.parse_args()
    a.binary = os.path.abspath(a.binary)
    a.env = {"NARAD_CLUSTER_SECRET": a.secret} if a.secret else {}
    phases = a.phases.split(",")
    res = {}
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    print(f"move copy rate: copy/stall {a.copy_rate or 'unlimited'}, rebalance "
          f"{a.rb_copy_rate if a.rb_copy_rate is not None else 'the default (32 MiB/s)'}", flush=True)
    if "disk" in phases:
        disk(a, res)
    if "copy" in phases:
        copy(a, res)
    if "stall" in phases:
        stall(a, res)
    if "rebalance" in phases:
        rebalance(a, res)
    print(f"load average at end: {os.getloadavg()[0]:.2f}", flush=True)
    print("targets (issue 37):")
    if "copy" in res:
        r = res["copy"]
        for name in ("dd_fdatasync_mb_s", "dd_dsync_mb_s"):
            if name in res:
                print(f"  copy throughput {r['mover_mb_s']:.0f} MB/s (mover), {r['wall_mb_s']:.0f} MB/s (POST -> flip) "
                      f"vs {name} {res[name]:.0f}: {r['mover_mb_s'] / res[name]:.2f} x / {r['wall_mb_s'] / res[name]:.2f} x"
                      + (" (target >= 0.5)" if name == "dd_fdatasync_mb_s" else ""))
    if "stall" in res:
        mv = res["stall"]["rows"][1]
        if mv["n"]:
            print(f"  freeze stall: p99 {mv['p99']:.0f} ms, max {mv['max']:.0f} ms of records sent during the move "
                  f"(target p99 <= 1000 ms): {'met' if mv['p99'] <= 1000 else 'not met'}")
    if "rebalance" in res:
        r = res["rebalance"]
        print(f"  produce during rebalance {r['during'] / r['steady']:.2f} x steady (target >= 0.7): "
              f"{'met' if r['during'] / r['steady'] >= 0.7 else 'not met'}")
    print(json.dumps({k: v for k, v in res.items()}, default=str))


if __name__ == "__main__":
    main()
