// sluice-preload-loop: N preads of one size on a page-cached file, nothing
// else, for counting instructions under callgrind (deterministic, unlike the
// wall-clock sluice-bench-preload). Run it natively and under LD_PRELOAD and
// divide the difference in total Ir by N:
//   valgrind --tool=callgrind sluice-preload-loop DIR SIZE N
//   LD_PRELOAD=.../libsluice_preload.so [SLUICE_RULES=noop.json] valgrind ...
// The same N with N=0 gives the fixed cost (start-up, exit) to subtract.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s DIR SIZE N\n", argv[0]);
    return 2;
  }
  const std::string path = std::string(argv[1]) + "/loop-" + std::to_string(::getpid()) + ".dat";
  const std::size_t size = std::strtoull(argv[2], nullptr, 10);
  const long n = std::strtol(argv[3], nullptr, 10);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    std::perror("open");
    return 1;
  }
  ::unlink(path.c_str());
  std::vector<char> buf(size > 0 ? size : 1, 'x');
  if (::pwrite(fd, buf.data(), size, 0) != static_cast<ssize_t>(size)) {
    std::perror("pwrite");
    return 1;
  }
  for (long i = 0; i < n; ++i) {
    if (::pread(fd, buf.data(), size, 0) != static_cast<ssize_t>(size)) std::abort();
  }
  ::close(fd);
  return 0;
}
