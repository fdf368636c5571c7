#!/usr/bin/env python3
"""Moves under attack: partitions moved again and again while every client
talks to one node, a node killed and kept dead for minutes with records
pushed past it, and a check that every 202'd record is delivered.

Release `narad serve --dev` nodes on loopback (temp data dirs, removed at
the end; every process started is killed by PID):

  1. 3 nodes n1..n3, a topic of --partitions partitions (visibility 5 s).
  2. --producers threads produce batches of 100 keyless records (each with
     a unique id, --rate records/s in all) through n1 until --records are
     accepted (202); one
     consumer thread long-polls consume (max=100) through n1 and acks every
     batch. All clients on n1.
  3. Meanwhile a mover asks n1 every --move-every s to move a random
     partition to a random other node (`POST /v1/cluster/moves`; a 409
     because 8 moves are in flight or the partition is moving is counted,
     not an error).
  4. Once a tenth of the records are accepted, n3 is killed (`kill -9`) and
     kept dead for --dead s while production goes on (moves to it abort,
     moves from it wait for it, force-promote or abort), then restarted.
  5. After the last record: the consumer reads on until every accepted id
     was delivered or --drain s pass.

Prints: records accepted, produce errors, moves asked / accepted / refused,
the nodes' narad_moves_total by outcome, distinct ids delivered, lost
(accepted, never delivered), duplicate deliveries, wall time. Exit 1 if
any accepted record was lost.

Usage: bench/cluster/move_attack.py [--binary target/release/narad]
       [--records 100000] [--rate 600] [--partitions 6] [--producers 4]
       [--move-every 2] [--dead 180] [--drain 180]
"""
import argparse, http.client, json, os, random, sys, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from metadata import Cluster, req  # noqa: E402

TOPIC = "attack"


class Producer(threading.Thread):
    def __init__(self, port, rate, t0, lock, accepted, counter):
        super().__init__(daemon=True)
        self.port, self.rate, self.t0 = port, rate, t0
        self.lock, self.accepted, self.counter = lock, accepted, counter
        self.errors = 0

    def run(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        pad = "p" * 200
        while True:
            with self.lock:
                if self.counter[0] >= self.counter[1]:
                    return
                first = self.counter[0]
                self.counter[0] += 100
            batch = list(range(first, min(first + 100, self.counter[1])))
            wait = self.t0 + first / self.rate - time.time()
            if wait > 0:
                time.sleep(wait)
            body = json.dumps({"messages": [{"payload": json.dumps({"id": i, "pad": pad})} for i in batch]})
            while True:
                try:
                    conn.request("POST", f"/v1/topics/{TOPIC}/produce/batch", body=body,
                                 headers={"content-type": "application/json"})
                    r = conn.getresponse()
                    r.read()
                    if r.status == 202:
                        with self.lock:
                            self.accepted.update(batch)
                        break
                    self.errors += 1
                except Exception:
                    self.errors += 1
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                time.sleep(0.2)


class Consumer(threading.Thread):
    def __init__(self, port):
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.seen, self.deliveries, self.errors = set(), 0, 0
        self.statuses = {}

    def run(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self.stop.is_set():
            try:
                conn.request("GET", f"/v1/topics/{TOPIC}/consume?max=100&wait=1000ms")
                r = conn.getresponse()
                body = r.read()
                if r.status == 204:
                    continue
                if r.status != 200:
                    self.errors += 1
                    key = f"{r.status} {body[:120].decode(errors='replace')}"
                    self.statuses[key] = self.statuses.get(key, 0) + 1
                    time.sleep(0.1)
                    continue
                msgs = json.loads(body).get("messages", [])
                for m in msgs:
                    self.seen.add(json.loads(m["payload"])["id"])
                    self.deliveries += 1
                handles = [m["receipt_handle"] for m in msgs]
                if handles:
                    conn.request("POST", f"/v1/topics/{TOPIC}/ack", body=json.dumps({"receipt_handles": handles}),
                                 headers={"content-type": "application/json"})
                    conn.getresponse().read()
            except Exception:
                self.errors += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                time.sleep(0.1)


def moves_total(c, i):
    code, body = req(c.url(i, "/metrics"), timeout=5)
    out = {}
    if code == 200:
        for line in body.decode(errors="replace").splitlines():
            if line.startswith("narad_moves_total{"):
                k, _, v = line.rpartition(" ")
                out[k.split('"')[1]] = int(float(v))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/release/narad")
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=600.0, help="records/s of all producers together")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--move-every", type=float, default=2.0)
    ap.add_argument("--dead", type=float, default=180.0)
    ap.add_argument("--drain", type=float, default=180.0)
    a = ap.parse_args()
    c = Cluster(a.binary, 3)
    lost = None
    try:
        c.leader()
        code, body = req(c.url(0, "/v1/topics"), "POST", json.dumps(
            {"name": TOPIC, "partitions": a.partitions, "visibility_timeout_ms": 5000}))
        assert code in (200, 201), (code, body)
        t0 = time.time()
        lock, accepted, counter = threading.Lock(), set(), [0, a.records]
        producers = [Producer(c.http[0], a.rate, t0, lock, accepted, counter) for _ in range(a.producers)]
        consumer = Consumer(c.http[0])
        for t in producers + [consumer]:
            t.start()
        asked = {"accepted": 0, "refused": 0, "other": 0}
        stop_moving = threading.Event()

        def mover():
            rng = random.Random(7)
            while not stop_moving.wait(a.move_every):
                p, to = rng.randrange(a.partitions), rng.choice(c.ids)
                code, _ = req(c.url(0, "/v1/cluster/moves"), "POST",
                              json.dumps({"topic": TOPIC, "partition": p, "to": to}), timeout=10)
                key = "accepted" if code in (200, 202) else "refused" if code in (400, 404, 409, 503) else "other"
                asked[key] += 1
        mt = threading.Thread(target=mover, daemon=True)
        mt.start()
        while len(accepted) < a.records // 10:
            time.sleep(0.2)
        killed_at = time.time()
        c.kill9(2)
        print(f"n3 killed at {killed_at - t0:.1f} s with {len(accepted)} accepted; kept dead {a.dead:.0f} s",
              flush=True)
        while time.time() - killed_at < a.dead:
            time.sleep(1)
        at_restart = len(accepted)
        c.spawn(2)
        c.wait_ready(2, timeout=120)
        print(f"n3 restarted at {time.time() - t0:.1f} s; {at_restart - a.records // 10} or more records "
              f"accepted while it was dead", flush=True)
        for t in producers:
            t.join()
        produced_at = time.time()
        stop_moving.set()
        mt.join()
        print(f"all {len(accepted)} records accepted at {produced_at - t0:.1f} s; draining", flush=True)
        end = time.time() + a.drain
        while time.time() < end and not accepted <= consumer.seen:
            time.sleep(1)
        consumer.stop.set()
        consumer.join(timeout=10)
        lost = accepted - consumer.seen
        outcomes = [moves_total(c, i) for i in range(3)]
        print(f"records accepted {len(accepted)}, produce errors (retried) {sum(p.errors for p in producers)}")
        print(f"moves asked through n1: {asked}")
        for i, o in enumerate(outcomes):
            print(f"  {c.ids[i]} narad_moves_total: {o}")
        print(f"delivered {len(consumer.seen)} distinct of {len(accepted)}; {consumer.deliveries} deliveries "
              f"({consumer.deliveries - len(consumer.seen)} duplicates); consume errors {consumer.errors}")
        for k, n in sorted(consumer.statuses.items()):
            print(f"  consume answered {n} x: {k}")
        print(f"LOST {len(lost)}" + (f", e.g. {sorted(lost)[:10]}" if lost else ""))
        print(f"wall {time.time() - t0:.1f} s", flush=True)
    finally:
        c.close()
    sys.exit(1 if lost is None or lost else 0)


if __name__ == "__main__":
    main()
