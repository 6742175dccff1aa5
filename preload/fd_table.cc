// Classification of one fd for the preload's fd table. Cold path: runs once
// per fd (after open, or at the first I/O on an inherited or duplicated fd).
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "preload.h"

namespace sluice::preload {
namespace {

FileKind kind_of(int fd, const struct stat& st) noexcept {
  switch (st.st_mode & S_IFMT) {
    case S_IFREG:
      return FileKind::kRegular;
    case S_IFDIR:
      return FileKind::kDir;
    case S_IFSOCK:
      return FileKind::kSocket;
    case S_IFIFO:
      return FileKind::kPipe;
    case S_IFCHR:
      return ::isatty(fd) ? FileKind::kTty : FileKind::kOther;
    default:
      return FileKind::kOther;  // block devices, anon inodes (eventfd, epoll, ...)
  }
}

}  // namespace

std::uint8_t classify_fd(int fd, const FdPolicy& policy) noexcept {
  if (fd < 0) return 0;
  int saved_errno = errno;
  struct stat st;
  // The raw syscall: no interposer (ours or another) between us and the kernel.
  if (::syscall(SYS_fstat, fd, &st) != 0) {
    errno = saved_errno;
    return 0;
  }
  FileKind kind = kind_of(fd, st);
  bool selected = (policy.kinds & kind_bit(kind)) != 0;
  if (selected && !policy.paths.empty() && (kind == FileKind::kRegular || kind == FileKind::kDir)) {
    char link[32];
    char path[4096];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    long n = ::syscall(SYS_readlink, link, path, sizeof path - 1);
    selected = false;
    if (n > 0) {
      std::string_view p(path, static_cast<std::size_t>(n));
      for (const std::string& prefix : policy.paths) {
        if (path_under(p, prefix)) {
          selected = true;
          break;
        }
      }
    }
  }
  errno = saved_errno;
  return static_cast<std::uint8_t>(kEntryKnown | (selected ? kEntrySelected : 0) |
                                   static_cast<std::uint8_t>(kind));
}

}  // namespace sluice::preload
