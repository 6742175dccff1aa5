// sluice-preload-probe: small POSIX I/O scenarios whose results are checked
// by the program itself, run natively and under libsluice_preload.so by
// preload_integration_test. Exit status 0 when every check held; otherwise a
// "FAIL ..." line on stderr per failed check and exit status 1.
//
//   probe errno DIR        EBADF everywhere, errno untouched by successful calls
//   probe eagain           EAGAIN from a non-blocking empty pipe
//   probe eintr            EINTR from a blocking pipe read under a SIGALRM handler
//                          installed without SA_RESTART
//   probe eof DIR          partial reads at EOF, through every read call
//   probe partial-write    partial writes to a full non-blocking pipe, then EAGAIN
//   probe io DIR           every data call once; prints {"read": R, "write": W}, the
//                          bytes moved on regular files
//   probe threads DIR N    N threads doing I/O on their own files; prints the bytes
//   probe fork DIR         fork (child writes a file), posix_spawn, vfork+exec
//   probe hello DIR        writes and reads one small file
//   probe badiov DIR       every vector call with an iovec array it may not read
//                          (EFAULT), an iovcnt out of range and a length above
//                          SSIZE_MAX (EINVAL), with and without RWF_NOWAIT
//   probe huge DIR         calls asking for far more than they can move: sizes the
//                          kernel refuses, 1 GiB reads 10,000 bytes before the end,
//                          bad fds; prints what each returned
//   probe nowait DIR       preadv2/pwritev2 (and 64v2) with RWF_NOWAIT of 1 MiB and
//                          4 KiB on DIR/limited/nowait.dat; prints what each returned
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "probe_check.h"

extern char** environ;

namespace {

long long g_made = 0;  // bytes make_file wrote

std::string make_file(const std::string& dir, const char* name, std::size_t size) {
  std::string path = dir + "/" + name;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char> data(size);
  for (std::size_t i = 0; i < size; ++i) data[i] = static_cast<char>('a' + i % 26);
  std::size_t off = 0;
  while (off < size) {
    ssize_t n = ::write(fd, data.data() + off, size - off);
    if (n <= 0) break;
    off += static_cast<std::size_t>(n);
  }
  g_made += static_cast<long long>(off);
  ::close(fd);
  return path;
}

int run_errno(const std::string& dir) {
  char buf[16];
  struct iovec iov = {buf, sizeof buf};
  errno = 0;
  CHECK_EQ(::read(-1, buf, sizeof buf), -1);
  CHECK_EQ(errno, EBADF);
  errno = 0;
  CHECK_EQ(::read(987654, buf, sizeof buf), -1);  // beyond any table
  CHECK_EQ(errno, EBADF);
  std::string path = make_file(dir, "errno.dat", 100);
  int fd = ::open(path.c_str(), O_RDONLY);
  ::close(fd);
  errno = 0;
  CHECK_EQ(::read(fd, buf, sizeof buf), -1);
  CHECK_EQ(errno, EBADF);
  errno = 0;
  CHECK_EQ(::pread(fd, buf, sizeof buf, 0), -1);
  CHECK_EQ(errno, EBADF);
  errno = 0;
  CHECK_EQ(::readv(fd, &iov, 1), -1);
  CHECK_EQ(errno, EBADF);
  errno = 0;
  CHECK_EQ(::write(fd, buf, sizeof buf), -1);
  CHECK_EQ(errno, EBADF);
  errno = 0;
  CHECK_EQ(::fsync(fd), -1);
  CHECK_EQ(errno, EBADF);
  errno = 0;
  CHECK_EQ(::close(fd), -1);
  CHECK_EQ(errno, EBADF);
  errno = 0;
  CHECK_EQ(::open((dir + "/does-not-exist").c_str(), O_RDONLY), -1);
  CHECK_EQ(errno, ENOENT);
  // Writing to a read-only fd.
  fd = ::open(path.c_str(), O_RDONLY);
  errno = 0;
  CHECK_EQ(::write(fd, buf, 1), -1);
  CHECK_EQ(errno, EBADF);
  // Successful calls leave errno alone.
  errno = 4242;
  CHECK_EQ(::pread(fd, buf, sizeof buf, 0), 16);
  CHECK_EQ(errno, 4242);
  CHECK_EQ(::read(fd, buf, sizeof buf), 16);
  CHECK_EQ(errno, 4242);
  CHECK_EQ(::fsync(fd), 0);
  CHECK_EQ(errno, 4242);
  CHECK_EQ(::close(fd), 0);
  CHECK_EQ(errno, 4242);
  fd = ::open(path.c_str(), O_RDONLY);
  CHECK_EQ(errno, 4242);
  ::close(fd);
  // EINVAL from an invalid iovec count.
  fd = ::open(path.c_str(), O_RDONLY);
  errno = 0;
  volatile int bad_count = -1;  // hidden from the compiler's argument checks
  CHECK_EQ(::readv(fd, &iov, bad_count), -1);
  CHECK_EQ(errno, EINVAL);
  ::close(fd);
  return g_failures;
}

int run_eagain() {
  int p[2];
  if (::pipe2(p, O_NONBLOCK) != 0) return 1;
  char buf[64];
  errno = 0;
  CHECK_EQ(::read(p[0], buf, sizeof buf), -1);
  CHECK_EQ(errno, EAGAIN);
  struct iovec iov = {buf, sizeof buf};
  errno = 0;
  CHECK_EQ(::readv(p[0], &iov, 1), -1);
  CHECK_EQ(errno, EAGAIN);
  CHECK_EQ(::write(p[1], "xyz", 3), 3);
  CHECK_EQ(::read(p[0], buf, sizeof buf), 3);
  ::close(p[0]);
  ::close(p[1]);
  return g_failures;
}

void on_alarm(int) {}

int run_eintr() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm;
  sa.sa_flags = 0;  // no SA_RESTART: the blocked read fails with EINTR
  sigemptyset(&sa.sa_mask);
  sigaction(SIGALRM, &sa, nullptr);
  int p[2];
  if (::pipe(p) != 0) return 1;
  struct itimerval it;
  std::memset(&it, 0, sizeof it);
  it.it_value.tv_usec = 50000;
  setitimer(ITIMER_REAL, &it, nullptr);
  char buf[8];
  errno = 0;
  CHECK_EQ(::read(p[0], buf, sizeof buf), -1);
  CHECK_EQ(errno, EINTR);
  it.it_value.tv_usec = 50000;
  setitimer(ITIMER_REAL, &it, nullptr);
  errno = 0;
  CHECK_EQ(::pread(p[0], buf, sizeof buf, 0), -1);  // pipes are not seekable
  CHECK_EQ(errno, ESPIPE);
  errno = 0;
  CHECK_EQ(::read(p[0], buf, sizeof buf), -1);
  CHECK_EQ(errno, EINTR);
  ::close(p[0]);
  ::close(p[1]);
  return g_failures;
}

int run_eof(const std::string& dir) {
  std::string path = make_file(dir, "eof.dat", 100);
  char buf[4096];
  int fd = ::open(path.c_str(), O_RDONLY);
  CHECK_EQ(::read(fd, buf, sizeof buf), 100);
  CHECK_EQ(::read(fd, buf, sizeof buf), 0);
  CHECK_EQ(::pread(fd, buf, sizeof buf, 60), 40);
  CHECK_EQ(::pread64(fd, buf, sizeof buf, 100), 0);
  struct iovec iov[2] = {{buf, 30}, {buf + 30, 200}};
  CHECK_EQ(::preadv(fd, iov, 2, 50), 50);
  CHECK_EQ(::preadv2(fd, iov, 2, 90, 0), 10);
  CHECK_EQ(::lseek(fd, 0, SEEK_SET), 0);
  CHECK_EQ(::readv(fd, iov, 2), 100);
  CHECK_EQ(::close(fd), 0);
  FILE* f = std::fopen(path.c_str(), "r");
  CHECK_EQ(std::fread(buf, 1, sizeof buf, f), 100);
  CHECK_EQ(std::fread(buf, 1, sizeof buf, f), 0);
  CHECK_EQ(std::feof(f) != 0, 1);
  std::rewind(f);
  CHECK_EQ(std::fread(buf, 30, 10, f), 3);  // 3 whole items of 30 bytes
  CHECK_EQ(std::fclose(f), 0);
  return g_failures;
}

int run_partial_write() {
  int p[2];
  if (::pipe2(p, O_NONBLOCK) != 0) return 1;
  long cap = ::fcntl(p[1], F_GETPIPE_SZ);
  std::vector<char> data(static_cast<std::size_t>(cap) + 100000, 'x');
  ssize_t n = ::write(p[1], data.data(), data.size());
  CHECK_EQ(n, cap);  // a partial write: exactly what fits
  errno = 0;
  CHECK_EQ(::write(p[1], data.data(), data.size()), -1);
  CHECK_EQ(errno, EAGAIN);
  std::vector<char> sink(4096);
  CHECK_EQ(::read(p[0], sink.data(), sink.size()), 4096);
  struct iovec iov[2] = {{data.data(), 100000}, {data.data(), 100000}};
  CHECK_EQ(::writev(p[1], iov, 2), 4096);
  ::close(p[0]);
  ::close(p[1]);
  return g_failures;
}

// Every data call once on regular files; prints the bytes moved.
int run_io(const std::string& dir) {
  long long rd = 0, wr = 0;
  std::string src = make_file(dir, "io-src.dat", 10000);
  std::string dst = dir + "/io-dst.dat";
  char buf[8192];
  std::memset(buf, 'q', sizeof buf);
  int in = ::open(src.c_str(), O_RDONLY);
  int out = ::open(dst.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  struct iovec iov[2] = {{buf, 1000}, {buf + 1000, 2000}};
  long long n;
  n = ::read(in, buf, 1234);
  CHECK_EQ(n, 1234);
  rd += n;
  n = ::pread(in, buf, 4000, 9000);
  CHECK_EQ(n, 1000);
  rd += n;
  n = ::pread64(in, buf, 100, 0);
  CHECK_EQ(n, 100);
  rd += n;
  n = ::readv(in, iov, 2);
  CHECK_EQ(n, 3000);
  rd += n;
  n = ::preadv(in, iov, 2, 8000);
  CHECK_EQ(n, 2000);
  rd += n;
  n = ::preadv64(in, iov, 2, 0);
  CHECK_EQ(n, 3000);
  rd += n;
  n = ::preadv2(in, iov, 2, 0, 0);
  CHECK_EQ(n, 3000);
  rd += n;
  n = ::preadv64v2(in, iov, 2, 500, 0);
  CHECK_EQ(n, 3000);
  rd += n;
  n = ::write(out, buf, 777);
  CHECK_EQ(n, 777);
  wr += n;
  n = ::pwrite(out, buf, 1000, 5000);
  CHECK_EQ(n, 1000);
  wr += n;
  n = ::pwrite64(out, buf, 10, 0);
  CHECK_EQ(n, 10);
  wr += n;
  n = ::writev(out, iov, 2);
  CHECK_EQ(n, 3000);
  wr += n;
  n = ::pwritev(out, iov, 2, 100);
  CHECK_EQ(n, 3000);
  wr += n;
  n = ::pwritev64(out, iov, 2, 200);
  CHECK_EQ(n, 3000);
  wr += n;
  n = ::pwritev2(out, iov, 2, 300, 0);
  CHECK_EQ(n, 3000);
  wr += n;
  n = ::pwritev64v2(out, iov, 2, 400, 0);
  CHECK_EQ(n, 3000);
  wr += n;
  CHECK_EQ(::fsync(out), 0);
  CHECK_EQ(::fdatasync(out), 0);
  off64_t off_in = 0;
  n = ::copy_file_range(in, &off_in, out, nullptr, 1 << 30, 0);  // "to the end": 10000
  CHECK_EQ(n, 10000);
  rd += n;
  wr += n;
  off_t soff = 5000;
  n = ::sendfile(out, in, &soff, 1 << 30);
  CHECK_EQ(n, 5000);
  rd += n;
  wr += n;
  ::close(in);
  ::close(out);
  FILE* f = std::fopen(src.c_str(), "r");
  n = static_cast<long long>(std::fread(buf, 10, 300, f)) * 10;
  CHECK_EQ(n, 3000);
  rd += n;
  n = static_cast<long long>(fread_unlocked(buf, 1, 500, f));
  CHECK_EQ(n, 500);
  rd += n;
  std::fclose(f);
  f = std::fopen(dst.c_str(), "w");
  n = static_cast<long long>(std::fwrite(buf, 100, 7, f)) * 100;
  CHECK_EQ(n, 700);
  wr += n;
  n = static_cast<long long>(fwrite_unlocked(buf, 1, 33, f));
  CHECK_EQ(n, 33);
  wr += n;
  std::fclose(f);
  // Through a creat'ed and a dup'ed fd.
  int c = ::creat((dir + "/io-creat.dat").c_str(), 0644);
  n = ::write(c, buf, 55);
  CHECK_EQ(n, 55);
  wr += n;
  int d = ::dup(c);
  n = ::write(d, buf, 45);
  CHECK_EQ(n, 45);
  wr += n;
  ::close(c);
  ::close(d);
  std::printf("{\"read\": %lld, \"write\": %lld}\n", rd, wr + g_made);
  return g_failures;
}

int run_threads(const std::string& dir, int nthreads) {
  constexpr int kRounds = 200;
  constexpr std::size_t kChunk = 4096;
  std::vector<std::thread> threads;
  std::vector<int> bad(static_cast<std::size_t>(nthreads), 0);
  for (int t = 0; t < nthreads; ++t) {
    threads.emplace_back([&, t] {
      std::string path = dir + "/thread-" + std::to_string(t) + ".dat";
      int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
      std::vector<char> w(kChunk, static_cast<char>('A' + t)), r(kChunk);
      for (int i = 0; i < kRounds; ++i) {
        if (::pwrite(fd, w.data(), kChunk, static_cast<off_t>(i * kChunk)) !=
            static_cast<ssize_t>(kChunk)) {
          ++bad[static_cast<std::size_t>(t)];
        }
        if (::pread(fd, r.data(), kChunk, static_cast<off_t>(i * kChunk)) !=
                static_cast<ssize_t>(kChunk) ||
            r != w) {
          ++bad[static_cast<std::size_t>(t)];
        }
      }
      ::close(fd);
    });
  }
  for (auto& th : threads) th.join();
  for (int b : bad) CHECK_EQ(b, 0);
  long long bytes = static_cast<long long>(nthreads) * kRounds * static_cast<long long>(kChunk);
  std::printf("{\"read\": %lld, \"write\": %lld}\n", bytes, bytes);
  return g_failures;
}

int run_fork(const std::string& dir) {
  pid_t pid = ::fork();
  if (pid == 0) {
    std::string p = make_file(dir, "child.dat", 3000);
    char buf[4096];
    int fd = ::open(p.c_str(), O_RDONLY);
    ssize_t n = ::read(fd, buf, sizeof buf);
    ::close(fd);
    std::exit(n == 3000 ? 0 : 3);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : 100, 0);
  // posix_spawn and vfork+exec: the children run a fresh image (this program's
  // "hello" scenario, and /bin/true).
  const char* spawn_argv[] = {"/proc/self/exe", "hello", dir.c_str(), nullptr};
  pid_t sp = 0;
  CHECK_EQ(::posix_spawn(&sp, "/proc/self/exe", nullptr, nullptr, const_cast<char**>(spawn_argv),
                         environ),
           0);
  ::waitpid(sp, &status, 0);
  CHECK_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : 100, 0);
  const char* true_argv[] = {"/bin/true", nullptr};
  pid_t vp = ::vfork();
  if (vp == 0) {
    ::execve("/bin/true", const_cast<char**>(true_argv), environ);
    ::_exit(127);
  }
  ::waitpid(vp, &status, 0);
  CHECK_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : 100, 0);
  // The parent's own I/O after its children.
  std::string p = make_file(dir, "parent.dat", 2000);
  char buf[4096];
  int fd = ::open(p.c_str(), O_RDONLY);
  CHECK_EQ(::read(fd, buf, sizeof buf), 2000);
  ::close(fd);
  return g_failures;
}

int run_hello(const std::string& dir) {
  std::string p = make_file(dir, "hello.dat", 500);
  char buf[1024];
  int fd = ::open(p.c_str(), O_RDONLY);
  CHECK_EQ(::read(fd, buf, sizeof buf), 500);
  ::close(fd);
  return g_failures;
}

// `r` and errno after a call that failed, as "r/ERRNO", else "r".
std::string outcome(long long r) {
  return r >= 0 ? std::to_string(r) : std::to_string(r) + "/" + std::to_string(errno);
}

int run_badiov(const std::string& dir) {
  std::string path = make_file(dir, "badiov.dat", 100);
  int fd = ::open(path.c_str(), O_RDWR);
  // Arrays the process may not read: a page with no access, and an address
  // in no mapping.
  void* page = ::mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return 1;
  const struct iovec* arrays[] = {static_cast<const struct iovec*>(page),
                                  reinterpret_cast<const struct iovec*>(8)};
  for (const struct iovec* iov : arrays) {
    for (int flags : {0, RWF_NOWAIT}) {
#define SLUICE_EXPECT_FAIL(call, err) \
  do {                                \
    errno = 0;                        \
    CHECK_EQ(call, -1);               \
    CHECK_EQ(errno, err);             \
  } while (0)
      SLUICE_EXPECT_FAIL(::preadv2(fd, iov, 1, 0, flags), EFAULT);
      SLUICE_EXPECT_FAIL(::preadv64v2(fd, iov, 1, 0, flags), EFAULT);
      SLUICE_EXPECT_FAIL(::pwritev2(fd, iov, 1, 0, flags), EFAULT);
      SLUICE_EXPECT_FAIL(::pwritev64v2(fd, iov, 1, 0, flags), EFAULT);
    }
    SLUICE_EXPECT_FAIL(::readv(fd, iov, 1), EFAULT);
    SLUICE_EXPECT_FAIL(::writev(fd, iov, 1), EFAULT);
    SLUICE_EXPECT_FAIL(::preadv(fd, iov, 1, 0), EFAULT);
    SLUICE_EXPECT_FAIL(::preadv64(fd, iov, 1, 0), EFAULT);
    SLUICE_EXPECT_FAIL(::pwritev(fd, iov, 1, 0), EFAULT);
    SLUICE_EXPECT_FAIL(::pwritev64(fd, iov, 1, 0), EFAULT);
  }
  // An iovcnt out of range is refused whatever the array holds.
  volatile int counts[] = {-1, IOV_MAX + 1, INT_MIN};  // hidden from argument checks
  for (int cnt : counts) {
    SLUICE_EXPECT_FAIL(::readv(fd, arrays[0], cnt), EINVAL);
    SLUICE_EXPECT_FAIL(::writev(fd, arrays[0], cnt), EINVAL);
    SLUICE_EXPECT_FAIL(::preadv2(fd, arrays[0], cnt, 0, RWF_NOWAIT), EINVAL);
    SLUICE_EXPECT_FAIL(::pwritev2(fd, arrays[0], cnt, 0, RWF_NOWAIT), EINVAL);
  }
  // A length above SSIZE_MAX.
  char buf[16];
  volatile std::size_t huge = SIZE_MAX;
  struct iovec too_long[2] = {{buf, sizeof buf}, {buf, huge}};
  for (int flags : {0, RWF_NOWAIT}) {
    SLUICE_EXPECT_FAIL(::preadv2(fd, too_long, 2, 0, flags), EINVAL);
    SLUICE_EXPECT_FAIL(::pwritev2(fd, too_long, 2, 0, flags), EINVAL);
  }
  SLUICE_EXPECT_FAIL(::readv(fd, too_long, 2), EINVAL);
  SLUICE_EXPECT_FAIL(::writev(fd, too_long, 2), EINVAL);
#undef SLUICE_EXPECT_FAIL
  // The file is as it was.
  char check[200];
  CHECK_EQ(::pread(fd, check, sizeof check, 0), 100);
  ::munmap(page, 4096);
  ::close(fd);
  return g_failures;
}

int run_huge(const std::string& dir) {
  constexpr std::size_t kSize = 1 << 20;
  constexpr std::size_t kLeft = 10000;
  std::string path = make_file(dir, "huge.dat", kSize);
  std::vector<char> buf(64 * 1024);
  // Hidden from the compiler, which would rightly object to them.
  volatile std::size_t size_max = SIZE_MAX;
  volatile std::size_t gib = std::size_t{1} << 30;
  int fd = ::open(path.c_str(), O_RDWR);
  std::vector<std::string> out;
  // Sizes the kernel refuses.
  out.push_back(outcome(::read(fd, buf.data(), size_max)));
  out.push_back(outcome(::pread(fd, buf.data(), size_max, 0)));
  out.push_back(outcome(::write(fd, buf.data(), size_max)));
  out.push_back(outcome(::pwrite64(fd, buf.data(), size_max, 0)));
  struct iovec whole = {buf.data(), size_max};
  out.push_back(outcome(::readv(fd, &whole, 1)));
  out.push_back(outcome(::pwritev(fd, &whole, 1, 0)));
  // 1 GiB asked for, 10,000 bytes left to move.
  CHECK_EQ(::lseek(fd, kSize - kLeft, SEEK_SET), static_cast<off_t>(kSize - kLeft));
  out.push_back(outcome(::read(fd, buf.data(), gib)));
  out.push_back(outcome(::pread(fd, buf.data(), gib, kSize - kLeft)));
  struct iovec big = {buf.data(), gib};
  out.push_back(outcome(::preadv(fd, &big, 1, kSize - kLeft)));
  FILE* f = std::fopen(path.c_str(), "r");
  std::fseek(f, kSize - kLeft, SEEK_SET);
  out.push_back(outcome(static_cast<long long>(std::fread(buf.data(), 1, gib, f))));
  std::fclose(f);
  // Bad fds.
  int closed = ::dup(fd);
  ::close(closed);
  out.push_back(outcome(::read(-1, buf.data(), gib)));
  out.push_back(outcome(::read(closed, buf.data(), gib)));
  out.push_back(outcome(::write(closed, buf.data(), size_max)));
  ::close(fd);
  std::string line = "[";
  for (std::size_t i = 0; i < out.size(); ++i) line += (i ? ", \"" : "\"") + out[i] + "\"";
  std::printf("%s]\n", line.c_str());
  return g_failures;
}

int run_nowait(const std::string& dir) {
  constexpr std::size_t kMiB = 1 << 20;
  // Written in DIR, read in DIR/limited: a test may enforce only the latter
  // (SLUICE_PATHS), so that writing the file spends none of its budget.
  std::string written = make_file(dir, "nowait.dat", 2 * kMiB);
  std::string path = dir + "/limited/nowait.dat";
  CHECK_EQ(::mkdir((dir + "/limited").c_str(), 0755), 0);
  CHECK_EQ(::rename(written.c_str(), path.c_str()), 0);
  int fd = ::open(path.c_str(), O_RDWR);
  std::vector<char> buf(kMiB);
  struct iovec big = {buf.data(), kMiB};
  struct iovec small = {buf.data(), 4096};
  std::string read_big = outcome(::preadv2(fd, &big, 1, 0, RWF_NOWAIT));
  std::string read64_big = outcome(::preadv64v2(fd, &big, 1, 0, RWF_NOWAIT));
  std::string write_big = outcome(::pwritev2(fd, &big, 1, 0, RWF_NOWAIT));
  std::string write64_big = outcome(::pwritev64v2(fd, &big, 1, 0, RWF_NOWAIT));
  std::string read_small = outcome(::preadv2(fd, &small, 1, 0, RWF_NOWAIT));
  std::printf(
      "{\"read_big\": \"%s\", \"read64_big\": \"%s\", \"write_big\": \"%s\", "
      "\"write64_big\": \"%s\", \"read_small\": \"%s\"}\n",
      read_big.c_str(), read64_big.c_str(), write_big.c_str(), write64_big.c_str(),
      read_small.c_str());
  ::close(fd);
  return g_failures;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(
        stderr,
        "usage: %s errno|eagain|eintr|eof|partial-write|io|threads|fork|hello|badiov|huge|nowait"
        " [DIR] [N]\n",
        argv[0]);
    return 2;
  }
  std::string cmd = argv[1];
  std::string dir = argc > 2 ? argv[2] : "/tmp";
  int failures = 0;
  if (cmd == "errno") {
    failures = run_errno(dir);
  } else if (cmd == "eagain") {
    failures = run_eagain();
  } else if (cmd == "eintr") {
    failures = run_eintr();
  } else if (cmd == "eof") {
    failures = run_eof(dir);
  } else if (cmd == "partial-write") {
    failures = run_partial_write();
  } else if (cmd == "io") {
    failures = run_io(dir);
  } else if (cmd == "threads") {
    failures = run_threads(dir, argc > 3 ? std::atoi(argv[3]) : 4);
  } else if (cmd == "fork") {
    failures = run_fork(dir);
  } else if (cmd == "hello") {
    failures = run_hello(dir);
  } else if (cmd == "badiov") {
    failures = run_badiov(dir);
  } else if (cmd == "huge") {
    failures = run_huge(dir);
  } else if (cmd == "nowait") {
    failures = run_nowait(dir);
  } else {
    std::fprintf(stderr, "unknown scenario %s\n", cmd.c_str());
    return 2;
  }
  return failures != 0 ? 1 : 0;
}
