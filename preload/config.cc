// SLUICE_* environment parsing for the preload. Runs once per process image
// (and the result is reused by a forked child); never on the hot path.
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <string>
#include <string_view>

#include "preload.h"
#include "sluice/stage.h"

namespace sluice::preload {
namespace {

constexpr std::size_t kMaxSocketPath = 107;  // sizeof(sockaddr_un::sun_path) - 1

Status bad(const char* var, std::string_view value, std::string_view why) {
  std::string m(var);
  m += '=';
  m += value;
  m += ": ";
  m += why;
  return Status::invalid(std::move(m));
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (true) {
    std::size_t pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string_view::npos ? pos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

// A default stage name from the process name: characters a name may not hold
// become '_'.
std::string sanitize_comm(std::string_view comm) {
  std::string out;
  for (char c : comm) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-';
    out += ok ? c : '_';
  }
  if (out.empty()) out = "proc";
  if (out.size() > 40) out.resize(40);  // room for "-<pid>" and fork children's "-<pid>"
  return out;
}

// Canonical form of a directory prefix: realpath when it exists (the fd table
// compares against /proc/self/fd links, which are canonical), trailing slashes
// removed.
std::string normalise_prefix(std::string_view p) {
  std::string s(p);
  if (char* real = ::realpath(s.c_str(), nullptr)) {
    s = real;
    std::free(real);
  }
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

}  // namespace

std::string_view kind_name(FileKind kind) noexcept {
  switch (kind) {
    case FileKind::kRegular:
      return "regular";
    case FileKind::kDir:
      return "dir";
    case FileKind::kSocket:
      return "socket";
    case FileKind::kPipe:
      return "pipe";
    case FileKind::kTty:
      return "tty";
    case FileKind::kOther:
      return "other";
    case FileKind::kUnknown:
      break;
  }
  return "unknown";
}

namespace {
// The kind_bit()s SLUICE_KINDS's `name` stands for: one kind by its kind_name(), or
// every kind ("all"); 0 for a name of none.
std::uint8_t kinds_named(std::string_view name) noexcept {
  std::uint8_t all = 0;
  for (auto k = static_cast<unsigned>(FileKind::kRegular);
       k <= static_cast<unsigned>(FileKind::kOther); ++k) {
    const auto kind = static_cast<FileKind>(k);
    if (kind_name(kind) == name) return kind_bit(kind);
    all |= kind_bit(kind);
  }
  return name == "all" ? all : 0;
}
}  // namespace

bool path_under(std::string_view path, std::string_view prefix) noexcept {
  if (prefix == "/") return !path.empty() && path.front() == '/';
  if (path.size() < prefix.size() || path.compare(0, prefix.size(), prefix) != 0) return false;
  return path.size() == prefix.size() || path[prefix.size()] == '/';
}

StatusOr<LogLevel> parse_log_level(const char* value) {
  if (value == nullptr || *value == '\0') return LogLevel::kWarn;
  std::string_view v(value);
  if (v == "off") return LogLevel::kOff;
  if (v == "error") return LogLevel::kError;
  if (v == "warn" || v == "warning") return LogLevel::kWarn;
  if (v == "info") return LogLevel::kInfo;
  if (v == "debug") return LogLevel::kDebug;
  return bad("SLUICE_LOG_LEVEL", v, "expected one of off, error, warn, info, debug");
}

StatusOr<Config> parse_config(EnvFn env, std::string_view comm, long pid, bool secure) {
  Config c;
  auto get = [env, secure](const char* name) -> const char* {
    return secure ? nullptr : env(name);
  };

  {
    auto level = parse_log_level(get("SLUICE_LOG_LEVEL"));
    if (!level.is_ok()) return level.status();
    c.log_level = *level;
  }

  if (const char* v = get("SLUICE_STAGE"); v != nullptr) {
    if (!valid_stage_name(v)) {
      return bad("SLUICE_STAGE", v, "a stage name is " + std::string(kStageNameRule));
    }
    c.stage_name = v;
  } else {
    c.stage_name = sanitize_comm(comm) + "-" + std::to_string(pid);
  }

  if (const char* v = get("SLUICE_SOCKET"); v != nullptr && *v != '\0') {
    std::string_view s(v);
    if (s.size() > kMaxSocketPath) {
      return bad("SLUICE_SOCKET", s, "a UNIX socket path is at most 107 bytes");
    }
    if (s.front() != '/') {
      return bad("SLUICE_SOCKET", s,
                 "must be an absolute path (a relative one names another socket once the "
                 "program changes directory)");
    }
    c.socket_path = s;
  }

  if (const char* v = get("SLUICE_RULES"); v != nullptr && *v != '\0') c.rules_path = v;

  if (const char* v = get("SLUICE_PATHS"); v != nullptr && *v != '\0') {
    for (std::string_view p : split(v, ':')) {
      if (p.empty()) continue;
      if (p.front() != '/') {
        return bad("SLUICE_PATHS", v,
                   "'" + std::string(p) +
                       "' is not an absolute directory (paths are "
                       "colon-separated absolute prefixes)");
      }
      c.paths.push_back(normalise_prefix(p));
    }
  }

  if (const char* v = get("SLUICE_KINDS"); v != nullptr && *v != '\0') {
    std::uint8_t kinds = 0;
    for (std::string_view k : split(v, ',')) {
      const std::uint8_t bits = kinds_named(k);
      if (bits == 0) {
        return bad("SLUICE_KINDS", v,
                   "unknown kind '" + std::string(k) +
                       "' (a comma-separated list of regular, dir, socket, pipe, tty, other, all)");
      }
      kinds |= bits;
    }
    c.kinds = kinds;
  }

  if (const char* v = get("SLUICE_FORK"); v != nullptr && *v != '\0') {
    std::string_view f(v);
    if (f == "fresh") {
      c.fork_mode = ForkMode::kFresh;
    } else if (f == "passthrough") {
      c.fork_mode = ForkMode::kPassthrough;
    } else {
      return bad("SLUICE_FORK", f, "expected fresh or passthrough");
    }
  }

  if (const char* v = get("SLUICE_TENANT"); v != nullptr && *v != '\0') {
    std::string_view t(v);
    std::uint32_t tenant = 0;
    auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), tenant);
    if (ec != std::errc() || end != t.data() + t.size()) {
      return bad("SLUICE_TENANT", t, "expected an integer in 0..4294967295");
    }
    c.tenant = tenant;
  }

  if (const char* v = get("SLUICE_ORIGIN"); v != nullptr && *v != '\0') {
    std::string_view o(v);
    bool ok = o.size() <= 63;
    for (char ch : o) {
      ok = ok && ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                  (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == ':' || ch == '-');
    }
    if (!ok) return bad("SLUICE_ORIGIN", o, "an origin name is 1-63 characters of [A-Za-z0-9_.:-]");
    c.origin = o;
  }

  if (const char* v = get("SLUICE_STATS_FILE"); v != nullptr && *v != '\0') c.stats_file = v;

  if (const char* v = get("SLUICE_READY_MS"); v != nullptr && *v != '\0') {
    std::string_view r(v);
    std::uint32_t ms = 0;
    auto [end, ec] = std::from_chars(r.data(), r.data() + r.size(), ms);
    if (ec != std::errc() || end != r.data() + r.size() || ms > kMaxReadyMs) {
      return bad(
          "SLUICE_READY_MS", r,
          "expected milliseconds in 0.." + std::to_string(kMaxReadyMs) + " (0: do not wait)");
    }
    c.ready_ms = ms;
  }

  return c;
}

}  // namespace sluice::preload
