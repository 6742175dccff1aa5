// /proc/PID/io: reading, parsing and deltas (proc_io.h).
#include "proc_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>

namespace sluice::control {

ProcIo parse_proc_io(std::string_view text) {
  ProcIo io;
  int found = 0;
  while (!text.empty()) {
    const std::size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view key = line.substr(0, colon);
    std::string_view rest = line.substr(colon + 1);
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), v);
    if (ec != std::errc() || end != rest.data() + rest.size()) continue;
    std::uint64_t* field = key == "rchar"         ? &io.rchar
                           : key == "wchar"       ? &io.wchar
                           : key == "read_bytes"  ? &io.read_bytes
                           : key == "write_bytes" ? &io.write_bytes
                                                  : nullptr;
    if (field != nullptr) {
      *field = v;
      ++found;
    }
  }
  io.valid = found == 4;
  return io;
}

ProcIo read_proc_io(std::int64_t pid) {
  if (pid <= 0) return {};
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%lld/io", static_cast<long long>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  char buf[1024];  // seven short lines
  std::size_t len = 0;
  while (len < sizeof(buf)) {
    const ssize_t n = ::read(fd, buf + len, sizeof(buf) - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return parse_proc_io(std::string_view(buf, len));
}

ProcIo advance_proc_io(ProcIo now, ProcIo& prev) {
  if (now.valid && prev.valid) {
    auto delta = [](std::uint64_t a, std::uint64_t b) { return a >= b ? a - b : 0; };
    now.delta_read_bytes = delta(now.read_bytes, prev.read_bytes);
    now.delta_write_bytes = delta(now.write_bytes, prev.write_bytes);
    now.delta_rchar = delta(now.rchar, prev.rchar);
    now.delta_wchar = delta(now.wchar, prev.wchar);
  }
  if (now.valid) prev = now;
  return now;
}

}  // namespace sluice::control
