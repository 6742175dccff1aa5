#!/usr/bin/env python3
"""Checks that the rooms depend on each other only as docs/design.md's table says:
a room uses only the rooms above it, in its #includes and in its CMake targets' links.

    scripts/check-layout.py [BUILD_DIR]

Includes: every quoted #include of a library room's source or header is resolved (the
including file's folder first, then every room's include folders) and must land in the
same room or one it may use; a "../" that leaves the room is refused too. Links: with
BUILD_DIR (a configured tree), `cmake --graphviz` lists the targets' link edges, and a
library target may link only the targets of the rooms its room may use.
Exits 1 naming each offence, 0 when there is none.
"""
import os
import re
import subprocess
import sys
import tempfile

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# room -> the rooms it may use (docs/design.md, "The rooms").
USES = {
    "libstage": set(),
    "enforcement-objects": {"libstage"},
    "policies": {"libstage"},
    "control-plane": {"libstage", "enforcement-objects", "policies"},
    "preload": {"libstage", "enforcement-objects"},
    "rocksdb": {"libstage", "enforcement-objects"},
}
# Where a room's headers are found by quoted includes from elsewhere.
INCLUDE_DIRS = {
    "libstage": ["libstage/include", "libstage/src"],
    "enforcement-objects": ["enforcement-objects/include", "enforcement-objects"],
    "policies": ["policies/include", "policies", "policies/cluster"],
    "control-plane": ["control-plane", "control-plane/cluster"],
    "preload": ["preload"],
    "rocksdb": ["rocksdb/include", "rocksdb"],
}
# The library targets of each room.
TARGETS = {
    "libstage": {"sluice_stage"},
    "enforcement-objects": {"sluice_objects"},
    "policies": {"sluice_policies"},
    "control-plane": {"sluice_control", "sluice"},
    "preload": {"sluice_preload", "sluice_preload_core", "sluice_preload_init"},
    "rocksdb": {"sluice_rocksdb", "sluice_rocksdb_plugin"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def room_of(path):
    rel = os.path.relpath(path, TOP)
    first = rel.split(os.sep)[0]
    return first if first in USES else None


def resolve(including, name):
    here = os.path.join(os.path.dirname(including), name)
    if os.path.isfile(here):
        return os.path.realpath(here)
    for dirs in INCLUDE_DIRS.values():
        for d in dirs:
            p = os.path.join(TOP, d, name)
            if os.path.isfile(p):
                return os.path.realpath(p)
    return None  # a system or generated header


def include_offences():
    out = []
    for room in USES:
        for base, dirs, files in os.walk(os.path.join(TOP, room)):
            dirs[:] = [d for d in dirs if d != "fuzz"]  # fuzz targets are test programs
            for f in files:
                if not f.endswith((".cc", ".h")):
                    continue
                path = os.path.join(base, f)
                text = open(path, errors="replace").read()
                for name in INCLUDE.findall(text):
                    target = resolve(path, name)
                    if target is None:
                        continue
                    other = room_of(target)
                    rel = os.path.relpath(path, TOP)
                    if name.startswith("../") and other != room:
                        out.append(f"{rel}: #include \"{name}\" reaches into {other} by a relative path")
                    elif other and other != room and other not in USES[room]:
                        out.append(f"{rel}: #include \"{name}\": {room} may not use {other}")
    return out


def link_offences(build):
    with tempfile.TemporaryDirectory() as tmp:
        dot = os.path.join(tmp, "deps.dot")
        subprocess.run(["cmake", f"--graphviz={dot}", build], check=True,
                       stdout=subprocess.DEVNULL)
        text = open(dot).read()
    # A label is the target's name, then its aliases after an escaped newline.
    names = {node: label.split("\\n")[0]
             for node, label in re.findall(r'"(node\d+)"\s*\[\s*label\s*=\s*"([^"]+)"', text)}
    room_of_target = {t: r for r, ts in TARGETS.items() for t in ts}
    out = []
    for a, b in re.findall(r'"(node\d+)"\s*->\s*"(node\d+)"', text):
        src, dst = names.get(a), names.get(b)
        ra, rb = room_of_target.get(src), room_of_target.get(dst)
        if ra and rb and ra != rb and rb not in USES[ra]:
            out.append(f"target {src} ({ra}) links {dst} ({rb}): {ra} may not use {rb}")
    return out


def main():
    offences = include_offences()
    if len(sys.argv) > 1:
        offences += link_offences(sys.argv[1])
    for o in offences:
        print(o, file=sys.stderr)
    if offences:
        print("layout: the rooms depend on each other only as docs/design.md's table says",
              file=sys.stderr)
        return 1
    print("layout: includes" + (" and links" if len(sys.argv) > 1 else "") + " follow the rooms' order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
