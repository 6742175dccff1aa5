#!/usr/bin/env python3
"""Samples one run of the per-application bandwidth experiment, as JSON lines.

Every PERIOD seconds until SIGTERM:
  - /proc/PID/io read_bytes of every running instance (PIDS_DIR/<name>.pid);
  - `sluice stats --json`: each stage's latest collect (bytes through its stage
    in that interval, the limiter's rate, the stage's rules_version), written once
    per collect;
  - `sluice policy show --json`: the policy's report (allocations, rates sent),
    written when it changes.

Times are CLOCK_REALTIME seconds ("t"), comparable with bash's $EPOCHREALTIME;
the daemon's collect times (CLOCK_MONOTONIC) are converted with the offset
measured here.

usage: sample.py SLUICE SOCKET PIDS_DIR OUT.jsonl [PERIOD]
"""
import json
import os
import signal
import subprocess
import sys
import time


def mono_to_real(ns):
    return ns / 1e9 + (time.time() - time.monotonic())


def cli(sluice, sock, *args):
    try:
        r = subprocess.run([sluice, "--socket", sock, "--timeout", "2000", *args],
                           capture_output=True, text=True, timeout=3)
        return json.loads(r.stdout) if r.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError):
        return None


def proc_read_bytes(pid):
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def limiter(stage):
    """(bytes, drl rate or None) of the stage's collect: channel 'app' if present."""
    stats = stage.get("stats") or {}
    for ch in stats.get("channels", []):
        if ch.get("name") == "app":
            rate = None
            for o in ch.get("objects", []):
                if o.get("type") == "drl":
                    rate = (o.get("state") or {}).get("rate")
            return ch.get("bytes", 0), rate
    return stats.get("bytes", 0), None


def main():
    sluice, sock, pids_dir, out_path = sys.argv[1:5]
    period = float(sys.argv[5]) if len(sys.argv) > 5 else 0.5
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    seen = {}  # stage -> last collected_at_ns
    last_report = None
    t0 = time.monotonic()
    k = 0
    with open(out_path, "a", buffering=1) as out:
        def emit(rec):
            out.write(json.dumps(rec, separators=(",", ":")) + "\n")

        while not stop:
            now = time.time()
            for name in sorted(os.listdir(pids_dir)) if os.path.isdir(pids_dir) else []:
                if not name.endswith(".pid"):
                    continue
                try:
                    pid = int(open(os.path.join(pids_dir, name)).read().split()[0])
                except (OSError, ValueError, IndexError):
                    continue
                rb = proc_read_bytes(pid)
                if rb is not None:
                    emit({"kind": "proc", "t": now, "inst": name[:-4], "pid": pid,
                          "read_bytes": rb})
            stages = cli(sluice, sock, "stats", "--json")
            for st in stages or []:
                s = st.get("stats") or {}
                at = s.get("collected_at_ns")
                if not at or seen.get(st["name"]) == at:
                    continue
                seen[st["name"]] = at
                b, rate = limiter(st)
                io = st.get("io") or {}
                emit({"kind": "stage", "t": mono_to_real(at), "inst": st["name"],
                      "pid": st.get("pid"), "interval_s": s.get("interval_ns", 0) / 1e9,
                      "bytes": b, "drl_rate": rate, "rules_version": st.get("rules_version"),
                      "io_delta_read_bytes": io.get("delta_read_bytes")})
            if k % 2 == 0:
                show = cli(sluice, sock, "policy", "show", "--json")
                rep = (show or {}).get("report")
                if rep and rep != last_report:
                    last_report = rep
                    emit({"kind": "policy", "t": time.time(), "policy": show.get("policy"),
                          "report": rep})
            k += 1
            delay = t0 + k * period - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:  # fell behind (busy machine): skip to the next tick
                k = int((time.monotonic() - t0) / period) + 1


if __name__ == "__main__":
    main()
