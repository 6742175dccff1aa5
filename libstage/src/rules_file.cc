// Reading rules files (read_text_file, read_rules_file) and making a stage
// from one (Stage::from_rules_file).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "sluice/json_text.h"
#include "sluice/stage.h"

namespace sluice {

StatusOr<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::io_error(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::io_error(path + ": read failed: " + std::strerror(errno));
  return ss.str();
}

namespace {

const char* file_kind(mode_t mode) {
  switch (mode & S_IFMT) {
    case S_IFDIR:
      return "a directory";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFIFO:
      return "a FIFO";
    case S_IFSOCK:
      return "a socket";
    default:
      return "not a regular file";
  }
}

Status not_regular(const std::string& path, mode_t mode) {
  return Status::invalid(path + ": " + file_kind(mode) + "; a rules file must be a regular file");
}

Status too_large(const std::string& path) {
  return Status::invalid(path + ": larger than " + std::to_string(kMaxRulesFileBytes >> 20) +
                         " MiB, the most a rules file may hold");
}

}  // namespace

StatusOr<std::string> read_rules_file(const std::string& path) {
  // Refuse what is not a regular file before opening it (opening a device
  // can do things), and again on the open file (the path may have changed
  // in between). O_NONBLOCK: opening a FIFO does not wait for a writer.
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return Status::io_error(path + ": cannot open: " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return not_regular(path, st.st_mode);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return Status::io_error(path + ": cannot open: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::fstat(fd, &st) != 0) return Status::io_error(path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return not_regular(path, st.st_mode);
  if (st.st_size > static_cast<off_t>(kMaxRulesFileBytes)) return too_large(path);
  // Read at most one byte past the limit: the file may be growing.
  std::string text(static_cast<std::size_t>(st.st_size) + 1, '\0');
  std::size_t got = 0;
  while (true) {
    if (got == text.size()) {
      if (text.size() > kMaxRulesFileBytes) return too_large(path);
      text.resize(std::min(text.size() * 2, kMaxRulesFileBytes + 1));
    }
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::io_error(path + ": read failed: " + std::strerror(errno));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  text.resize(got);
  return text;
}

StatusOr<std::unique_ptr<Stage>> Stage::from_rules_file(const std::string& path,
                                                        StageOptions options) {
  auto text = read_rules_file(path);
  if (!text.is_ok()) return text.status();
  auto rules = parse_json_text(text.value());
  if (!rules.is_ok()) return rules.status().with_prefix(path + ": ");
  auto stage = create(std::move(options));
  if (!stage.is_ok()) return stage.status();
  Status s = stage.value()->apply(rules.value());
  if (!s.is_ok()) return s.with_prefix(path + ": ");
  return stage;
}

}  // namespace sluice
