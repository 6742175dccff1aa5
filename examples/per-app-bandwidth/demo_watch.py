#!/usr/bin/env python3
"""The live view and the verdict of the main job's demonstration (scripts/demo.sh).

Polls `sluice policy show --json` and prints one line per control step: each instance's
bandwidth in the last interval (its /proc/PID/io, as the maxmin policy measured it) and
the allocation it had during that interval, then the total against MaxB. When DONE_FILE
appears it checks what the demo is meant to show and exits 0, or 1 with the reasons:
  - steady steps (no instance started or finished in the last two steps): every instance
    within TOL of its allocation, and at or above 90% of its goal, in >= 80% of them;
  - no steady step with the total above MaxB by more than TOL;
  - when an instance finishes, the others together reach 85% of MaxB within two steps
    (the leftover moved).

usage: demo_watch.py SLUICE SOCKET MAXB_BYTES DONE_FILE
"""
import json
import os
import subprocess
import sys
import time

MIB = 1048576.0
TOL = 0.15


def show(sluice, sock):
    try:
        r = subprocess.run([sluice, "--socket", sock, "policy", "show", "--json"],
                           capture_output=True, text=True, timeout=3)
        return json.loads(r.stdout) if r.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError):
        return None


def main():
    sluice, sock, maxb, done_file = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    steps = []  # (t, {stage: report})
    names = []
    last_round = None
    t0 = time.monotonic()
    done_at = None
    while True:
        s = show(sluice, sock)
        rnd = ((s or {}).get("metrics") or {}).get("rounds")
        if s and rnd != last_round:
            last_round = rnd
            st = (s.get("report") or {}).get("stages") or {}
            if st or steps:
                steps.append((time.monotonic() - t0, st))
                new_name = False
                for n in sorted(st):
                    if n not in names:
                        names.append(n)
                        new_name = True
                if new_name or len(steps) % 15 == 0:
                    print("  time  " + "".join(f"{n + ' MiB/s (alloc)':>20}" for n in names)
                          + "   total / MaxB", flush=True)
                prev = steps[-2][1] if len(steps) > 1 else {}
                cells = []
                for n in names:
                    if n in st and n in prev:
                        cells.append(f"{st[n]['measured'] / MIB:>8.0f} ({prev[n]['allocation'] / MIB:>4.0f})")
                    elif n in st:
                        cells.append(f"{'start':>8} ({st[n]['allocation'] / MIB:>4.0f})")
                    elif n in prev:
                        cells.append(f"{'done':>15}")
                    else:
                        cells.append(f"{'':>15}")
                total = sum(v["measured"] for n, v in st.items() if n in prev)
                print(f"{steps[-1][0]:6.1f}  " + "".join(f"{c:>20}" for c in cells)
                      + f"   {total / MIB:5.0f} / {maxb / MIB:.0f}", flush=True)
        if done_at is None and os.path.exists(done_file):
            done_at = time.monotonic()
        if done_at is not None and time.monotonic() - done_at > 1.5:
            break
        time.sleep(0.25)
    sys.exit(verdict(steps, maxb))


def verdict(steps, maxb):
    problems = []
    sets = [frozenset(st) for _, st in steps]
    steady = {n: [0, 0, 0] for _, st in steps for n in st}  # windows, near alloc, >= 90% goal
    over = 0
    for k in range(2, len(steps)):
        if not sets[k] or not (sets[k] == sets[k - 1] == sets[k - 2]):
            continue
        st, prev = steps[k][1], steps[k - 1][1]
        for n, v in st.items():
            a = prev[n]["allocation"]
            steady[n][0] += 1
            steady[n][1] += abs(v["measured"] - a) <= TOL * a
            steady[n][2] += v["measured"] >= 0.9 * v["goal"]
        if sum(v["measured"] for v in st.values()) > (1 + TOL) * maxb:
            over += 1
    print("\nsteady steps (no instance started or finished in the last two):")
    for n, (w, near, goal) in sorted(steady.items()):
        print(f"  {n}: {w} steps, {near} within {TOL:.0%} of the allocation, "
              f"{goal} at >= 90% of the goal")
        if w == 0:
            problems.append(f"{n} had no steady step")
        elif near < 0.8 * w or goal < 0.8 * w:
            problems.append(f"{n} did not follow its allocation / goal in 80% of steady steps")
    if over:
        problems.append(f"the total exceeded MaxB by more than {TOL:.0%} in {over} steady step(s)")
    # The leftover: after a departure, the rest reach 85% of MaxB within two steps.
    moved = 0
    for k in range(1, len(steps)):
        gone = sets[k - 1] - sets[k]
        if not gone or not sets[k]:
            continue
        later = [sum(v["measured"] for n, v in steps[j][1].items() if n in steps[j - 1][1])
                 for j in range(k + 1, min(k + 3, len(steps))) if sets[j] == sets[k]]
        best = max(later, default=0)
        ok = best >= 0.85 * maxb
        moved += ok
        print(f"  {', '.join(sorted(gone))} finished: the others reached {best / MIB:.0f} MiB/s "
              f"of {maxb / MIB:.0f} within two steps ({'ok' if ok else 'too little'})")
        if not ok and len(later) == 2:
            problems.append(f"leftover not handed out after {', '.join(sorted(gone))} finished")
    if moved == 0:
        problems.append("no departure was followed by the leftover moving to the others")
    if problems:
        print("\nDEMO FAILED: " + "; ".join(problems))
        return 1
    print("\nDemo OK: each instance followed its max-min allocation (at least its goal), "
          "and the leftover moved to the others when one finished.")
    return 0


if __name__ == "__main__":
    main()
