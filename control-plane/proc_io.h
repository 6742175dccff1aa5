// /proc/PID/io of a stage's process, as the daemon reads it for a policy's
// input (ProcIo, sluice/policy.h): the process's cumulative I/O counters, and
// how far they moved since the previous reading. The pid is the one the
// kernel reported for the stage's connection, never one a peer claims.
//
// Thread safety: pure functions; read_proc_io reads one file.
#pragma once

#include <cstdint>
#include <string_view>

#include "sluice/policy.h"

namespace sluice::control {

// The counters in the text of a /proc/PID/io file; valid when rchar, wchar,
// read_bytes and write_bytes are all there. Other lines are skipped.
ProcIo parse_proc_io(std::string_view text);
// Reads /proc/PID/io (valid=false when it cannot be read: the process is
// gone, or the daemon may not read it).
ProcIo read_proc_io(std::int64_t pid);
// `now` with its delta_* fields set to how far each counter moved since
// `prev` (0 for one that went back); then `prev` becomes `now`. An invalid
// reading (either one) leaves the deltas 0, and an invalid `now` leaves
// `prev` as it was, so the next valid reading counts from the last good one.
ProcIo advance_proc_io(ProcIo now, ProcIo& prev);

}  // namespace sluice::control
