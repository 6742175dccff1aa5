#!/usr/bin/env bash
# Runs clang's thread-safety analysis (-Wthread-safety, -Wthread-safety-beta)
# over the C++ sources where it can find something, syntax only (nothing is
# compiled or linked), and fails on any warning clang prints. The locking
# contracts it checks are the annotations of sluice/thread_annotations.h:
# which mutex guards which field, which functions need it held.
#
# Where it looks: every source of the library rooms (libstage, the RocksDB
# binding, enforcement-objects, policies, control-plane, preload), which
# define and implement the annotated classes; and any other source (tests,
# benchmarks, examples) that names a capability or an annotation itself or in
# a header of its own folder (sluice::Mutex, MutexLock, the SLUICE_ macros,
# thread_annotations.h, ReservedFdLock: the only public functions that
# acquire or require a capability). A source that does neither calls only
# unannotated public functions, where the analysis has nothing to check.
#
#   scripts/check-thread-safety.sh [BUILD_DIR=build [SOURCE...]]
#
# With SOURCEs (paths from the repository's top), only those are checked.
# The sources and their flags come from BUILD_DIR/compile_commands.json (the
# tree is configured first when it has none), with the compiler replaced by
# clang and the flags only g++ knows dropped. Each source is checked once.
# First, a self-test: tests/thread_safety/misuse.cc breaks each kind of
# contract on purpose, and clang must report exactly the warnings its
# comments expect (so that annotations which silently stopped reaching the
# analysis fail here too).
#   SLUICE_ANALYSED_BY=DIR ...    skip the sources a clang build in DIR compiled
#                                 (clang runs the same analysis as it compiles,
#                                 CMakeLists.txt); CI passes its sanitized build
#   SLUICE_CLANG=clang++-14 ...   another clang
#   SLUICE_JOBS=N ...             parallel clang processes (default: nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$(pwd -P)
BUILD=${1:-build}
shift $(($# > 0 ? 1 : 0))
CLANG=${SLUICE_CLANG:-clang++}
JOBS=${SLUICE_JOBS:-$(nproc)}
command -v "$CLANG" >/dev/null || { echo "$CLANG not found (scripts/install-deps.sh)" >&2; exit 2; }
ANALYSIS=(-fsyntax-only -Wthread-safety -Wthread-safety-beta)
# For the tree: every warning fails. Attributes only g++ knows (gnu::noipa)
# are g++'s to check; the preload's constinit descriptor table (a million
# atomics) needs more constant-evaluation steps than clang allows by default.
TREE=("${ANALYSIS[@]}" -Werror -Wno-unknown-attributes -fconstexpr-steps=67108864)

if [ ! -f "$BUILD/compile_commands.json" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi

if ! "$CLANG" -std=c++20 -Ilibstage/include "${ANALYSIS[@]}" -Xclang -verify \
  tests/thread_safety/misuse.cc; then
  echo "thread-safety self-test: clang did not report the contracts tests/thread_safety/misuse.cc" \
    "breaks as its comments expect (sluice/thread_annotations.h)" >&2
  exit 1
fi

# One line per source: the clang command, shell-quoted.
commands=$(SLUICE_ANALYSED_BY=${SLUICE_ANALYSED_BY:-} python3 - "$SRC" "$BUILD/compile_commands.json" "$CLANG" "${TREE[@]}" -- "$@" <<'EOF'
import json, os, re, shlex, sys

src, db, clang = sys.argv[1], sys.argv[2], sys.argv[3]
analysed_by = os.environ["SLUICE_ANALYSED_BY"]
split = sys.argv.index("--")
analysis = sys.argv[4:split]
only = {os.path.realpath(os.path.join(src, f)) for f in sys.argv[split + 1:]}
build = os.path.realpath(os.path.dirname(db))
# Flags only g++ knows (clang warns about them).
GCC_ONLY = {"-Wno-restrict", "-Wno-subobject-linkage"}
LIBRARY_ROOMS = ("libstage", "enforcement-objects", "policies", "control-plane", "preload")
NAMES_A_CAPABILITY = re.compile(
    r"thread_annotations\.h|ReservedFdLock|\bMutex(Lock)?\b|"
    r"SLUICE_(GUARDED_BY|PT_GUARDED_BY|REQUIRES|ACQUIRE|RELEASE|EXCLUDES|TRY_ACQUIRE|"
    r"ASSERT_CAPABILITY|CAPABILITY|SCOPED_CAPABILITY|RETURN_CAPABILITY|NO_THREAD_SAFETY)")
LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def worth_checking(path):
    rel = os.path.relpath(path, src)
    if rel.split(os.sep)[0] in LIBRARY_ROOMS:
        return True
    text = open(path, errors="replace").read()
    for inc in LOCAL_INCLUDE.findall(text):
        local = os.path.join(os.path.dirname(path), inc)
        if os.path.isfile(local):
            text += open(local, errors="replace").read()
    return NAMES_A_CAPABILITY.search(text) is not None


UNITY_SOURCE = re.compile(r'^\s*#\s*include\s+"([^"]+\.cc)"', re.M)


def unity_sources(path):
    """The tree's sources a unity batch (CMake's Unity/unity_*.cxx) includes."""
    if os.sep + "Unity" + os.sep not in path or not path.endswith(".cxx"):
        return []
    return [os.path.realpath(p) for p in UNITY_SOURCE.findall(open(path).read())]


def entry_sources(e, build):
    path = os.path.realpath(os.path.join(e["directory"], e["file"]))
    # A unity batch is checked as it is compiled: its sources in one parse.
    sources = unity_sources(path) if path.startswith(build + os.sep) else [path]
    return path, [p for p in sources if p.startswith(src + os.sep) and p.endswith(".cc")]


# Sources a clang build compiled with the analysis on (-Wthread-safety, as
# CMakeLists.txt gives every clang build) need no second look.
done = set()
if analysed_by:
    other = os.path.realpath(analysed_by)
    for e in json.load(open(os.path.join(other, "compile_commands.json"))):
        cmd = " ".join(e["arguments"]) if "arguments" in e else e["command"]
        if "-Wthread-safety" in cmd:  # not every target takes the project's warnings
            done.update(entry_sources(e, other)[1])
    if not done:
        sys.exit(f"SLUICE_ANALYSED_BY={analysed_by}: nothing there was compiled with "
                 "-Wthread-safety (configure that tree with clang)")

seen = set()
for e in json.load(open(db)):
    path, sources = entry_sources(e, build)
    if done and all(p in done for p in sources):
        continue
    if not sources or path in seen or (only and not any(p in only for p in sources)):
        continue
    seen.add(path)
    if not only and not any(worth_checking(p) for p in sources):
        continue
    args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
    out, skip = [clang], False
    for i, a in enumerate(args[1:], 1):
        if skip:
            skip = False
        elif a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
        elif a == "-include" and args[i + 1].endswith("cmake_pch.hxx"):
            skip = True  # g++'s precompiled headers; clang parses the source's own includes
        elif a in ("-c", "-MD", "-MMD", "-Winvalid-pch") or a in GCC_ONLY or a == e["file"] or a == path:
            pass
        else:
            out.append(a)
    out += analysis + [path]
    print("cd " + shlex.quote(e["directory"]) + " && " + " ".join(shlex.quote(a) for a in out))
EOF
)
if [ -z "$commands" ] && [ -n "${SLUICE_ANALYSED_BY:-}" ]; then
  echo "thread-safety: every source was analysed as $SLUICE_ANALYSED_BY compiled it"
  exit 0
elif [ -z "$commands" ]; then
  echo "thread-safety: no sources of this tree in $BUILD/compile_commands.json" >&2
  exit 2
fi
count=$(printf '%s\n' "$commands" | wc -l)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# A source's diagnostics are written whole, so that parallel runs do not interleave.
status=0
printf '%s\n' "$commands" |
  xargs -d '\n' -P "$JOBS" -I{} sh -c 'out=$( { {} ; } 2>&1) || rc=$?; [ -z "$out" ] || printf "%s\n" "$out"; exit ${rc:-0}' \
    >"$log" || status=$?
if [ "$status" != 0 ] || [ -s "$log" ]; then
  cat "$log" >&2
  echo "thread-safety analysis: clang reported the above (sluice/thread_annotations.h)" >&2
  exit 1
fi
echo "thread-safety: $count compile units clean (a unity batch is one)"
