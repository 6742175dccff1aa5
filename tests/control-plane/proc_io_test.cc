// /proc/PID/io as the daemon reads it for a policy's input (proc_io.h):
// parsing, deltas between readings, and reading a live process.
#include <unistd.h>

#include <climits>
#include <string>

#include <catch2/catch.hpp>

#include "proc_io.h"

using sluice::ProcIo;
using sluice::control::advance_proc_io;
using sluice::control::parse_proc_io;
using sluice::control::read_proc_io;

namespace {

std::string io_text(unsigned long long rchar, unsigned long long wchar,
                    unsigned long long read_bytes, unsigned long long write_bytes) {
  return "rchar: " + std::to_string(rchar) + "\nwchar: " + std::to_string(wchar) +
         "\nsyscr: 12\nsyscw: 3\nread_bytes: " + std::to_string(read_bytes) +
         "\nwrite_bytes: " + std::to_string(write_bytes) + "\ncancelled_write_bytes: 0\n";
}

}  // namespace

TEST_CASE("a /proc/PID/io text is parsed", "[proc_io]") {
  const ProcIo io = parse_proc_io(io_text(1000, 2000, 4096, 8192));
  CHECK(io.valid);
  CHECK(io.rchar == 1000);
  CHECK(io.wchar == 2000);
  CHECK(io.read_bytes == 4096);
  CHECK(io.write_bytes == 8192);
  CHECK(io.delta_rchar == 0);  // one reading has no deltas
  // The largest counter the kernel can write.
  CHECK(parse_proc_io(io_text(ULLONG_MAX, 0, 0, 0)).rchar == ULLONG_MAX);
  // Without the final newline, and with other lines in between.
  CHECK(parse_proc_io("rchar: 1\nnoise\nwchar: 2\nread_bytes: 3\nwrite_bytes: 4").valid);
}

TEST_CASE("a /proc/PID/io text without all four counters is not valid", "[proc_io]") {
  CHECK_FALSE(parse_proc_io("").valid);
  CHECK_FALSE(parse_proc_io("rchar: 1\nwchar: 2\nread_bytes: 3\n").valid);
  CHECK_FALSE(parse_proc_io("rchar: 1\nwchar: 2\nread_bytes: 3\nwrite_bytes: x\n").valid);
  CHECK_FALSE(parse_proc_io("rchar: 1\nwchar: 2\nread_bytes: 3\nwrite_bytes: 4 KiB\n").valid);
  CHECK_FALSE(parse_proc_io("rchar: 1\nwchar: 2\nread_bytes: 3\nwrite_bytes: -4\n").valid);
}

TEST_CASE("readings advance: deltas since the last good one", "[proc_io]") {
  ProcIo prev;
  ProcIo first = advance_proc_io(parse_proc_io(io_text(100, 200, 300, 400)), prev);
  CHECK(first.valid);
  CHECK(first.delta_read_bytes == 0);  // nothing to compare with yet
  CHECK(prev.read_bytes == 300);

  ProcIo second = advance_proc_io(parse_proc_io(io_text(150, 260, 1300, 400)), prev);
  CHECK(second.delta_rchar == 50);
  CHECK(second.delta_wchar == 60);
  CHECK(second.delta_read_bytes == 1000);
  CHECK(second.delta_write_bytes == 0);

  // A reading that fails leaves no deltas and the last good one in place.
  ProcIo failed = advance_proc_io(ProcIo{}, prev);
  CHECK_FALSE(failed.valid);
  CHECK(failed.delta_read_bytes == 0);
  CHECK(prev.read_bytes == 1300);
  ProcIo third = advance_proc_io(parse_proc_io(io_text(150, 260, 1400, 900)), prev);
  CHECK(third.delta_read_bytes == 100);
  CHECK(third.delta_write_bytes == 500);

  // A counter that went back (another process behind the pid) counts 0.
  ProcIo back = advance_proc_io(parse_proc_io(io_text(10, 20, 30, 40)), prev);
  CHECK(back.delta_rchar == 0);
  CHECK(back.delta_read_bytes == 0);
  CHECK(prev.rchar == 10);
}

TEST_CASE("a live process's /proc/PID/io is read; a pid that is none is not", "[proc_io]") {
  CHECK_FALSE(read_proc_io(0).valid);
  CHECK_FALSE(read_proc_io(-1).valid);
  CHECK_FALSE(read_proc_io(INT_MAX).valid);  // above any pid_max
  if (::access("/proc/self/io", R_OK) != 0) {
    WARN("/proc/self/io is not readable here: the live reading is not checked");
    return;
  }
  const ProcIo self = read_proc_io(::getpid());
  CHECK(self.valid);
  CHECK(self.rchar > 0);  // the test binary's loader read its libraries
}
