#!/usr/bin/env python3
"""The driver of examples/cluster (run.sh calls it): control across machines, on one
machine. One etcd on loopback; N node daemons (`sluice serve --cluster`), each with a
process of stages that enforce what the daemon sets (sluice-cluster-stage); three
controller replicas (`sluice cluster`, global-rate) with report logs; a tenant with a
global limit whose demand is spread unevenly and moves between nodes mid-run; a node's
daemon stopped (SIGSTOP, its stages running on) and later another node cut off from
etcd (its etcd connection goes through a loopback relay that drops everything for a
while); the leader killed -9 and a node lost (its daemon and stages killed -9). Then the
scale run by simulation: 1,000 nodes x 100 stages summarised at 1 Hz
(sluice-bench-cluster --etcd) with one `sluice cluster` leader stepping over them, and
the write ceiling of the etcd member (the same bench putting back to back).

usage: run.py --build DIR --out DIR [--mode full|quick|smoke] [--dir DIR]
              [--sluice PATH] [--etcd PATH] [--plan-only]

Writes OUT/params.json (the plan), OUT/raw/: nodes/<node>.jsonl (the stages' bins),
ctl-<id>.jsonl (the replicas' report logs), history.jsonl (every write under the
cluster's prefix as etcd's watch delivered it, with the wall time it arrived),
events.json (the stop, cut, kill and loss times, the leases etcd granted), scale.json
(the scale run), and the processes' logs; OUT/raw/static/ the same for the baseline
run (budgets kept while cut off). README.md explains the setup and the scaling.
"""
import base64
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.util import driver_parser, log, run_scope, wait_for_socket, write_json  # noqa: E402

MIB = 1024 * 1024
CLUSTER = "ex"

# The settings the example is scaled from (README.md): Pisces' tenants over 8-20
# servers; TiDB's global resource control (a tenant's cluster-wide rate).
PAPER = {"pisces_servers": [8, 20], "tidb": "a resource group's cluster-wide rate limit",
         "scale_nodes": 1000, "scale_stages_per_node": 100, "scale_hz": 1}

# Seconds after the start: settle (windows before it are not scored), the demand
# move, a node's daemon stopped (for stop_len_s), a node cut off from etcd (for
# cut_len_s), the leader's kill, the node's loss, the end. scale_s: the scale run's
# length; ceiling_s: the write-ceiling run's.
MODES = {
    "full": {"settle_s": 10, "move_s": 30, "stop_s": 42, "stop_len_s": 10, "cut_s": 60,
             "cut_len_s": 10, "kill_s": 78, "loss_s": 92, "end_s": 115,
             "scale_nodes": 1000, "scale_stages": 100, "scale_s": 60, "ceiling_s": 10},
    "quick": {"settle_s": 8, "move_s": 22, "stop_s": 30, "stop_len_s": 8, "cut_s": 44,
              "cut_len_s": 8, "kill_s": 58, "loss_s": 70, "end_s": 86,
              "scale_nodes": 1000, "scale_stages": 100, "scale_s": 20, "ceiling_s": 5},
    "smoke": {"settle_s": 6, "move_s": 12, "stop_s": 16, "stop_len_s": 4, "cut_s": 23,
              "cut_len_s": 4, "kill_s": 30, "loss_s": 36, "end_s": 44,
              "scale_nodes": 200, "scale_stages": 100, "scale_s": 5, "ceiling_s": 3},
}


def plan(mode):
    m = dict(MODES[mode])
    limit = 8 * MIB
    # Demand per node (bytes/s), before and after the move: n1's load moves to n4; n2
    # (cut off from etcd, then lost) and n3 (stopped) keep theirs. Every phase wants
    # more than the limit, without the stopped, the cut-off or the lost node too, so
    # that the limit binds throughout.
    before = {"n1": 6 * MIB, "n2": 3 * MIB, "n3": 2.5 * MIB, "n4": 1 * MIB}
    after = {"n1": 1 * MIB, "n2": 3 * MIB, "n3": 2.5 * MIB, "n4": 6 * MIB}
    m.update({
        "tenant": "A", "limit": limit, "nodes": sorted(before), "stages_per_node": 2,
        "demand_before": before, "demand_after": after, "moved_from": "n1",
        "moved_to": "n4", "lost_node": "n2", "stopped_node": "n3", "cut_node": "n2",
        "replicas": ["ctl-1", "ctl-2", "ctl-3"],
        "interval_ms": 1000, "lease_s": 2, "bin_ms": 250, "scale_tenants": 10,
        # The nodes' demand estimate (docs/cluster.md): a node that is not held back
        # asks for what it got x (1 + headroom), one that is asks for probe x its budget.
        "node_headroom": 0.05, "node_probe": 2.5,
        # The same run once more before it, with budgets that stay in force while a node
        # is cut off (the baseline; not in the smoke run).
        "baseline": mode != "smoke",
        # What a node falls back to without its lease: the controller's min_rate (its
        # default), split among the node's stages.
        "fallback_total": 65536,
    })
    return m


def b64(s):
    return base64.b64encode(s.encode()).decode()


def unb64(s):
    return base64.b64decode(s).decode(errors="replace")


def prefix_end(p):
    return p[:-1] + chr(ord(p[-1]) + 1)


def etcd_call(url, path, body, timeout=2.0):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_etcd(args, procs, tmp, name, raw):
    """One etcd member on free loopback ports with its data in the scratch directory."""
    for _ in range(5):
        c, p = free_port(), free_port()
        url, peer = f"http://127.0.0.1:{c}", f"http://127.0.0.1:{p}"
        cmd = [args.etcd, "--data-dir", os.path.join(tmp, name), "--name", name,
               "--listen-client-urls", url, "--advertise-client-urls", url,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", f"{name}={peer}", "--log-level", "error"]
        with open(os.path.join(raw, f"{name}.log"), "w") as f:
            proc = procs.start(cmd, f, f)
        for _ in range(200):
            try:
                etcd_call(url, "/v3/kv/range", {"key": b64("/probe")}, timeout=0.5)
                return url, proc
            except OSError:
                if proc.poll() is not None:
                    break
                time.sleep(0.05)
        proc.kill()
        proc.wait()
    raise SystemExit(f"run.py: etcd did not start (see {raw}/{name}.log)")


class History:
    """Every write under `prefix`, from revision 1, with the wall time it arrived
    (etcd's watch over HTTP: one JSON message a line)."""

    def __init__(self, url, prefix, path):
        self.url, self.prefix, self.path = url, prefix, path
        self.f = open(path, "w")
        self.conn = None
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        host, port = self.url.split("//")[1].split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=600)
        body = {"create_request": {"key": b64(self.prefix),
                                   "range_end": b64(prefix_end(self.prefix)),
                                   "start_revision": "1"}}
        try:
            self.conn.request("POST", "/v3/watch", body=json.dumps(body),
                              headers={"Content-Type": "application/json"})
            resp = self.conn.getresponse()
            while True:
                line = resp.readline()
                if not line:
                    return
                now = time.time()
                msg = json.loads(line).get("result", {})
                for e in msg.get("events", []):
                    kv = e.get("kv", {})
                    key = unb64(kv.get("key", ""))
                    rec = {"unix": now, "key": key[len(self.prefix):],
                           "type": e.get("type", "PUT"),
                           "mod_revision": int(kv.get("mod_revision", 0))}
                    if rec["type"] != "DELETE" and not rec["key"].startswith("nodes/"):
                        try:
                            rec["value"] = json.loads(unb64(kv.get("value", "")))
                        except ValueError:
                            rec["value"] = None
                    self.f.write(json.dumps(rec) + "\n")
                    self.f.flush()
        except (OSError, ValueError, http.client.HTTPException):
            return

    def close(self):
        try:
            if self.conn is not None and self.conn.sock is not None:
                self.conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.t.join(timeout=2)
        self.f.close()


def leader_of(url):
    try:
        j = etcd_call(url, "/v3/election/leader",
                      {"name": b64(f"/sluice/{CLUSTER}/election")})
        return unb64(j["kv"]["value"])
    except (OSError, KeyError, ValueError):
        return None


def leases(url):
    """The leases etcd holds now, with the TTL it granted each."""
    out = []
    try:
        ids = etcd_call(url, "/v3/lease/leases", {}).get("leases", [])
        for x in ids:
            t = etcd_call(url, "/v3/lease/timetolive", {"ID": x["ID"]})
            out.append({"id": x["ID"], "granted_ttl": int(t.get("grantedTTL", 0))})
    except (OSError, ValueError):
        pass
    return out


def metrics(url):
    """etcd's counters of writes (from /metrics)."""
    want = ("etcd_mvcc_put_total", "etcd_mvcc_txn_total",
            "etcd_server_proposals_committed_total", "etcd_mvcc_db_total_size_in_bytes")
    out = {}
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] in want:
                out[parts[0]] = float(parts[1])
    return out


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sleep_to(t):
    d = t - time.time()
    if d > 0:
        time.sleep(d)


class Relay:
    """A TCP relay from a loopback port to etcd that can be cut: while cut, every byte
    either way is dropped and new connections are held without a peer, so the node's
    calls time out as on a partitioned network; restored, new connections are relayed
    (those held meanwhile are closed)."""

    def __init__(self, url):
        host, port = url.split("//")[1].split(":")
        self.target = (host, int(port))
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(64)
        self.url = f"http://127.0.0.1:{self.srv.getsockname()[1]}"
        self.is_cut = threading.Event()
        self.lock = threading.Lock()
        self.held = []
        threading.Thread(target=self.accept_loop, daemon=True).start()

    def accept_loop(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            if self.is_cut.is_set():
                with self.lock:
                    self.held.append(c)
                continue
            try:
                u = socket.create_connection(self.target, timeout=2)
            except OSError:
                c.close()
                continue
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self.pump, args=(a, b), daemon=True).start()

    def pump(self, a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                if not self.is_cut.is_set():
                    b.sendall(d)
        except OSError:
            pass
        for x in (a, b):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self):
        self.is_cut.set()

    def restore(self):
        with self.lock:
            for c in self.held:
                c.close()
            self.held = []
        self.is_cut.clear()

    def close(self):
        self.srv.close()


def run_cluster(args, p, procs, tmp, raw, budget_leases=True):
    """One cluster run into `raw`; budget_leases false: the baseline, whose nodes keep
    their budgets while cut off (docs/cluster.md, node field budget_leases)."""
    os.makedirs(raw, exist_ok=True)
    url, _ = start_etcd(args, procs, tmp, "etcd-run" if budget_leases else "etcd-static", raw)
    log(f"etcd at {url}")
    history = History(url, f"/sluice/{CLUSTER}/", os.path.join(raw, "history.jsonl"))
    policy = {"policy": "global-rate", "interval_ms": p["interval_ms"], "lease_s": p["lease_s"],
              "config": {"tenants": {p["tenant"]: {"limit": p["limit"]}}}}
    write_json(os.path.join(raw, "cluster-policy.json"), policy)
    ctl = {}
    for rid in p["replicas"]:
        with open(os.path.join(raw, f"{rid}.log"), "w") as f:
            ctl[rid] = procs.start([args.sluice, "cluster", "--etcd", url, "--cluster", CLUSTER,
                                    "--policy", os.path.join(raw, "cluster-policy.json"),
                                    "--id", rid, "--report-log",
                                    os.path.join(raw, f"report-{rid}.jsonl")], f, f)
    start = time.time() + 2.0
    os.makedirs(os.path.join(raw, "nodes"), exist_ok=True)
    nodes = {}
    relay = Relay(url)
    for n in p["nodes"]:
        cfg = {"etcd": relay.url if n == p["cut_node"] else url, "cluster": CLUSTER,
               "node": n, "interval_ms": p["interval_ms"],
               "lease_s": p["lease_s"], "headroom": p["node_headroom"],
               "probe": p["node_probe"], "budget_leases": budget_leases}
        write_json(os.path.join(raw, f"node-{n}.json"), cfg)
        sock = os.path.join(tmp, f"{n}{'' if budget_leases else '-static'}.sock")
        with open(os.path.join(raw, f"daemon-{n}.log"), "w") as f:
            daemon = procs.start([args.sluice, "serve", "--socket", sock, "--interval",
                                  str(p["interval_ms"]), "--cluster",
                                  os.path.join(raw, f"node-{n}.json")], f, f)
        if not wait_for_socket(sock, daemon):
            raise SystemExit(f"run.py: {n}'s daemon did not start (see {raw}/daemon-{n}.log)")
        b, a = p["demand_before"][n], p["demand_after"][n]
        demand = f"0:{b:.0f},{p['move_s']}:{a:.0f}"
        with open(os.path.join(raw, f"stages-{n}.log"), "w") as f:
            stages = procs.start([args.stage_bin, "--socket", sock, "--node", n, "--tenant",
                                  p["tenant"], "--stages", str(p["stages_per_node"]),
                                  "--demand", demand, "--start-unix", f"{start:.6f}",
                                  "--duration", str(p["end_s"]), "--bin-ms", str(p["bin_ms"]),
                                  "--out", os.path.join(raw, "nodes", f"{n}.jsonl")], f, f)
        nodes[n] = (daemon, stages)
    events = {"start_unix": start}
    log(f"running {p['end_s']} s: move at {p['move_s']}, {p['stopped_node']} stopped at "
        f"{p['stop_s']}, {p['cut_node']} cut off at {p['cut_s']}, leader kill at "
        f"{p['kill_s']}, node loss at {p['loss_s']}")
    sleep_to(start + p["settle_s"])
    events["leases"] = leases(url)
    sleep_to(start + p["stop_s"])
    stopped = nodes[p["stopped_node"]][0]
    stopped.send_signal(signal.SIGSTOP)
    events["stop_unix"] = time.time()
    log(f"stopped {p['stopped_node']}'s daemon (SIGSTOP; its stages run on)")
    sleep_to(start + p["stop_s"] + p["stop_len_s"])
    stopped.send_signal(signal.SIGCONT)
    events["cont_unix"] = time.time()
    log(f"resumed {p['stopped_node']}'s daemon")
    sleep_to(start + p["cut_s"])
    relay.cut()
    events["cut_unix"] = time.time()
    log(f"cut {p['cut_node']} off from etcd")
    sleep_to(start + p["cut_s"] + p["cut_len_s"])
    relay.restore()
    events["restore_unix"] = time.time()
    log(f"restored {p['cut_node']}'s etcd connection")
    sleep_to(start + p["kill_s"])
    victim = leader_of(url)
    if victim not in ctl:
        raise SystemExit(f"run.py: no leader to kill at {p['kill_s']} s (etcd says {victim!r})")
    ctl[victim].send_signal(signal.SIGKILL)
    events["kill_unix"] = time.time()
    events["killed_leader"] = victim
    log(f"killed leader {victim} (-9)")
    sleep_to(start + p["loss_s"])
    daemon, stages = nodes[p["lost_node"]]
    daemon.send_signal(signal.SIGKILL)
    stages.send_signal(signal.SIGKILL)
    events["loss_unix"] = time.time()
    log(f"killed node {p['lost_node']} (daemon and stages, -9)")
    sleep_to(start + p["end_s"] + 1.0)
    events["leader_at_end"] = leader_of(url)
    for n, (_, st) in nodes.items():
        if n != p["lost_node"]:
            try:
                st.wait(timeout=10)
            except subprocess.TimeoutExpired:
                st.kill()
    # The replicas stop before etcd's history does: a replica that takes over as the
    # others step down writes its decisions while the history still records them.
    for c in ctl.values():
        if c.poll() is None:
            c.send_signal(signal.SIGTERM)
    for c in ctl.values():
        try:
            c.wait(timeout=10)
        except subprocess.TimeoutExpired:
            c.kill()
    time.sleep(0.5)
    write_json(os.path.join(raw, "events.json"), events)
    history.close()
    relay.close()
    procs.kill_all()


def bench_json(cmd, path):
    r = subprocess.run(cmd, capture_output=True, text=True)
    with open(path + ".log", "w") as f:
        f.write(r.stderr)
    if r.returncode != 0:
        raise SystemExit(f"run.py: {' '.join(cmd)} failed ({r.returncode}): {r.stderr[-500:]}")
    out = json.loads(r.stdout)
    write_json(path, out)
    return out


def run_scale(args, p, procs, tmp, raw):
    url, _ = start_etcd(args, procs, tmp, "etcd-scale", raw)
    nodes, stages, tenants = p["scale_nodes"], p["scale_stages"], p["scale_tenants"]
    policy = {"policy": "global-rate", "interval_ms": 1000, "lease_s": p["lease_s"],
              "config": {"tenants": {f"t{i}": {"limit": 1e9} for i in range(tenants)}}}
    write_json(os.path.join(raw, "scale-policy.json"), policy)
    with open(os.path.join(raw, "scale-ctl.log"), "w") as f:
        leader = procs.start([args.sluice, "cluster", "--etcd", url, "--cluster", "sim",
                              "--policy", os.path.join(raw, "scale-policy.json"), "--id",
                              "scale-ctl", "--report-log",
                              os.path.join(raw, "scale-ctl.jsonl")], f, f)
    time.sleep(1.0)
    log(f"scale run: {nodes} nodes x {stages} stages at 1 Hz for {p['scale_s']} s")
    m0, c0, t0 = metrics(url), cpu_s(leader.pid), time.time()
    run = bench_json([args.bench_bin, "--nodes", str(nodes), "--stages", str(stages),
                      "--tenants", str(tenants), "--steps", "2", "--etcd", url,
                      "--cluster", "sim", "--seconds", str(p["scale_s"]),
                      "--interval-ms", "1000"], os.path.join(raw, "scale-bench.json"))
    m1, c1, t1 = metrics(url), cpu_s(leader.pid), time.time()
    leader.send_signal(signal.SIGTERM)
    leader.wait(timeout=10)
    log(f"write ceiling: puts back to back for {p['ceiling_s']} s")
    ceiling = bench_json([args.bench_bin, "--nodes", str(nodes), "--stages", str(stages),
                          "--tenants", str(tenants), "--steps", "1", "--etcd", url,
                          "--cluster", "ceiling", "--seconds", str(p["ceiling_s"]),
                          "--interval-ms", "1"], os.path.join(raw, "ceiling-bench.json"))
    write_json(os.path.join(raw, "scale.json"), {
        "wall_s": t1 - t0, "leader_cpu_s": c1 - c0, "metrics_before": m0, "metrics_after": m1,
        "bench": run, "ceiling": ceiling})
    procs.kill_all()


def main():
    ap = driver_parser(MODES, __doc__)
    ap.add_argument("--dir", default="/tmp",
                    help="where the scratch directory (etcd's data, sockets) goes")
    ap.add_argument("--sluice", default=None)
    ap.add_argument("--etcd", default=os.environ.get("SLUICE_ETCD", "/usr/bin/etcd"))
    args = ap.parse_args()
    args.sluice = args.sluice or os.path.join(args.build, "control-plane", "sluice")
    args.stage_bin = os.path.join(args.build, "examples", "cluster", "sluice-cluster-stage")
    args.bench_bin = os.path.join(args.build, "bench", "sluice-bench-cluster")
    p = plan(args.mode)
    raw = os.path.join(args.out, "raw")
    shutil.rmtree(raw, ignore_errors=True)  # the replicas append to their report logs
    os.makedirs(raw, exist_ok=True)
    write_json(os.path.join(args.out, "params.json"),
               {"mode": args.mode, "command": args.command, "paper": PAPER, "scaled": p})
    if args.plan_only:
        return
    for b in (args.sluice, args.stage_bin, args.bench_bin, args.etcd):
        if not os.access(b, os.X_OK):
            raise SystemExit(f"run.py: {b} not found (ninja -C {args.build} sluice "
                             f"sluice-cluster-stage sluice-bench-cluster; etcd: Debian's "
                             f"etcd-server)")
    with run_scope(prefix="sluice-cluster.", dir=args.dir) as (procs, tmp):
        if p["baseline"]:
            log("baseline: the same run with budgets that stay in force while cut off")
            run_cluster(args, p, procs, tmp, os.path.join(raw, "static"), budget_leases=False)
        run_cluster(args, p, procs, tmp, raw)
        run_scale(args, p, procs, tmp, raw)


if __name__ == "__main__":
    main()
