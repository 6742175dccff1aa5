#!/usr/bin/env python3
"""The daemon under many idle and half-open connections: does it keep serving,
and does its memory come back?

Starts `sluice serve` on a socket of its own, then:

  idle     --connections peers (half of them silent, half holding the first
           bytes of a frame they never finish); while they are held, times
           `sluice stages` (the CLI, process start included) and a list_stages
           request on a fresh connection, and a new stage's hello until its
           ack; then closes them all.
  frames   --frames peers each holding --frame-bytes of an unfinished frame;
           then closes them.

and reports the daemon's RSS (VmRSS) idle, at each phase's peak and after each
phase's peers have gone (the daemon returns memory at its next sweep), with
its own connection metrics (`policy show`). JSON on stdout, one object.

  bench/connections.py --sluice build/control-plane/sluice
                       [--connections 2000] [--frames 300] [--frame-bytes 3145728]
                       [--nofile N]   (run the daemon under `ulimit -n N`)
                       [--serve-arg=--max-connections=... ...]

A measurement, not a test: the figures depend on the machine and its load.
"""
import argparse
import json
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time


def frame(obj):
    payload = json.dumps(obj, separators=(",", ":")).encode()
    return struct.pack(">I", len(payload)) + payload


def read_frame(sock, timeout):
    sock.settimeout(timeout)
    buf = b""
    while len(buf) < 4:
        chunk = sock.recv(4 - len(buf))
        if not chunk:
            raise EOFError("closed")
        buf += chunk
    (n,) = struct.unpack(">I", buf)
    body = b""
    while len(body) < n:
        chunk = sock.recv(min(1 << 20, n - len(body)))
        if not chunk:
            raise EOFError("closed mid-frame")
        body += chunk
    return json.loads(body)


def request(path, msg_type, timeout=5.0, **fields):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        s.connect(path)
        msg = {"v": 1, "type": msg_type, "id": 1}
        msg.update(fields)
        s.sendall(frame(msg))
        return read_frame(s, timeout)
    finally:
        s.close()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def metrics(path):
    r = request(path, "policy_show")
    return r.get("metrics", {}).get("connections", {})


def timed_ms(fn):
    t0 = time.monotonic()
    ok = True
    try:
        fn()
    except Exception:  # noqa: BLE001 - a failure is a result here
        ok = False
    return (time.monotonic() - t0) * 1e3, ok


def summary(samples):
    samples = sorted(samples)
    if not samples:
        return {}
    return {
        "n": len(samples),
        "p50_ms": round(samples[len(samples) // 2], 2),
        "max_ms": round(samples[-1], 2),
    }


def settle(path, pid, want_open, timeout=15.0):
    """Waits until the daemon holds at most want_open connections (besides the
    one asking), then one sweep more, and returns its RSS."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if metrics(path).get("open", 1 << 30) <= want_open + 1:
                break
        except Exception:  # noqa: BLE001
            pass
        time.sleep(0.1)
    time.sleep(1.5)  # the sweep (at most a second apart) returns memory
    return rss_kib(pid)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sluice", required=True)
    ap.add_argument("--connections", type=int, default=2000)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--frame-bytes", type=int, default=3 << 20)
    ap.add_argument("--nofile", type=int, default=0)
    ap.add_argument("--cli-samples", type=int, default=20)
    ap.add_argument("--serve-arg", action="append", default=[])
    args = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = args.connections + args.frames + 64
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(need, soft)), hard))

    tmp = tempfile.mkdtemp(prefix="sluice-conn-bench-")
    path = os.path.join(tmp, "d.sock")
    cmd = [args.sluice, "serve", "--socket", path, "--log-level", "error"] + args.serve_arg

    def limit():
        if args.nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, args.nofile))

    daemon = subprocess.Popen(cmd, preexec_fn=limit)
    out = {"connections": args.connections, "frames": args.frames,
           "frame_bytes": args.frame_bytes, "nofile": args.nofile or None,
           "serve_args": args.serve_arg}
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                request(path, "list_stages", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        for _ in range(5):
            request(path, "list_stages")
        time.sleep(1.5)
        out["rss_idle_kib"] = idle = rss_kib(daemon.pid)

        # -- idle and half-open peers
        peers = []
        for i in range(args.connections):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(True)
            try:
                s.connect(path)
                if i % 2:
                    # a frame announced at 1 MiB, 100 bytes of it sent
                    s.sendall(struct.pack(">I", 1 << 20) + b" " * 100)
            except OSError:
                s.close()
                continue
            peers.append(s)
        time.sleep(0.5)
        cli, direct = [], []
        cli_ok = direct_ok = 0
        for _ in range(args.cli_samples):
            ms, ok = timed_ms(lambda: subprocess.run(
                [args.sluice, "--socket", path, "--timeout", "5000", "stages"],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            cli.append(ms)
            cli_ok += ok
            ms, ok = timed_ms(lambda: request(path, "list_stages"))
            direct.append(ms)
            direct_ok += ok

        stage = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

        def hello():
            stage.settimeout(5)
            stage.connect(path)
            stage.sendall(frame({"v": 1, "type": "hello", "id": 1, "name": "late",
                                 "pid": os.getpid(), "protocol": 1}))
            r = read_frame(stage, 5)
            if r.get("type") != "ack":
                raise RuntimeError(r)
        hello_ms, hello_ok = timed_ms(hello)
        m = metrics(path)
        out["idle"] = {
            "peers_connected": len(peers),
            "rss_peak_kib": rss_kib(daemon.pid),
            "cli_stages": dict(summary(cli), ok=cli_ok),
            "list_stages_request": dict(summary(direct), ok=direct_ok),
            "new_stage_hello_ms": round(hello_ms, 2), "new_stage_ok": hello_ok,
            "daemon": m,
        }
        for s in peers:
            s.close()
        stage.close()
        out["idle"]["rss_after_kib"] = after = settle(path, daemon.pid, 0)
        out["idle"]["after_over_idle"] = round(after / idle, 2)

        # -- unfinished frames
        peers = []
        chunk = b" " * (1 << 20)
        for _ in range(args.frames):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                s.settimeout(2)
                s.sendall(struct.pack(">I", 4 << 20))
                left = args.frame_bytes
                while left > 0:
                    n = min(left, len(chunk))
                    s.sendall(chunk[:n])
                    left -= n
            except OSError:
                pass  # closed by the daemon (the budget): expected
            peers.append(s)
        time.sleep(0.5)
        m = metrics(path)
        out["frames_phase"] = {"rss_peak_kib": rss_kib(daemon.pid), "daemon": m}
        for s in peers:
            s.close()
        out["frames_phase"]["rss_after_kib"] = after = settle(path, daemon.pid, 0)
        out["frames_phase"]["after_over_idle"] = round(after / idle, 2)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
        try:
            os.unlink(path)
        except OSError:
            pass
        os.rmdir(tmp)
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
