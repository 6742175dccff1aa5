// sluice-preload-host-probe: programs that use their descriptors and signals
// the way real hosts do, for preload_host_test, which runs them under
// libsluice_preload.so with a control socket. Exit status 0 when every check
// held; otherwise "FAIL ..." lines on stderr and exit status 1.
//
//   host_probe dup2-all DIR      waits for a line on stdin; dup2()s its own file
//                                onto every descriptor 3..N (N: two past the
//                                highest open one), writes lines through each,
//                                closes them; checks the file holds every line
//   host_probe close-all DIR     waits for a line on stdin; close_range(3, ~0U),
//                                closefrom(3), close() of
//                                3..4200; checks fcntl sees nothing open above 2;
//                                prints "closed", waits for a line on stdin, then
//                                writes a file
//   host_probe sigterm           blocks SIGTERM, prints "ready", reads SIGTERM
//                                from a signalfd and exits 0 (graceful)
//   host_probe sigchld N         blocks SIGCHLD; N times: forks a child that exits,
//                                waits for SIGCHLD on a signalfd (2 s at most),
//                                reaps it; prints "seen S of N"
//   host_probe write DIR         writes one small file (the first enforced I/O)
//   host_probe fcntl DIR         fcntl commands of every argument kind (none, int,
//                                pointer) behave as documented
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "probe_check.h"

namespace {

void say(const char* line) {
  std::printf("%s\n", line);
  std::fflush(stdout);
}

// Blocks until the test writes a line on stdin.
void wait_for_go() {
  char c = 0;
  while (::read(0, &c, 1) == 1 && c != '\n') {
  }
}

int highest_open_fd() {
  int high = 2;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') high = std::max(high, std::atoi(e->d_name));
    }
    ::closedir(d);
  }
  return high;
}

bool write_all(int fd, const std::string& s) {
  return ::write(fd, s.data(), s.size()) == static_cast<ssize_t>(s.size());
}

int run_dup2_all(const std::string& dir) {
  say("started");
  wait_for_go();
  const std::string path = dir + "/dup2-all.txt";
  const int out = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
  if (out < 0) return 1;
  const int high = highest_open_fd() + 2;  // every descriptor Sluice holds, and beyond
  std::vector<int> fds;
  for (int fd = 3; fd <= high; ++fd) {
    if (fd == out) continue;
    CHECK_EQ(::dup2(out, fd), fd);
    fds.push_back(fd);
  }
  constexpr int kRounds = 20;
  int written = 0;
  for (int round = 0; round < kRounds; ++round) {
    for (int fd : fds) {
      const std::string line =
          "fd " + std::to_string(fd) + " round " + std::to_string(round) + "\n";
      if (write_all(fd, line)) {
        ++written;
      } else {
        std::fprintf(stderr, "FAIL write fd %d: %s\n", fd, std::strerror(errno));
        ++g_failures;
      }
    }
    ::usleep(5000);  // let the control client's thread run between rounds
  }
  for (int fd : fds) CHECK_EQ(::close(fd), 0);
  ::close(out);
  // Every line, once.
  FILE* f = std::fopen(path.c_str(), "r");
  int lines = 0;
  char buf[256];
  while (f != nullptr && std::fgets(buf, sizeof buf, f) != nullptr) ++lines;
  if (f != nullptr) std::fclose(f);
  CHECK_EQ(lines, static_cast<long long>(fds.size()) * kRounds);
  CHECK_EQ(written, static_cast<long long>(fds.size()) * kRounds);
  std::printf("descriptors 3..%d, lines %d\n", high, lines);
  return g_failures;
}

int run_close_all(const std::string& dir) {
  say("started");
  wait_for_go();
  CHECK_EQ(::close_range(3, ~0U, 0), 0);
  ::closefrom(3);
  for (int fd = 3; fd < 4200; ++fd) (void)::close(fd);
  // To this program, nothing above 2 is open.
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  const int limit =
      rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 65536 ? 65536 : static_cast<int>(rl.rlim_cur);
  int open_fds = 0;
  for (int fd = 3; fd < limit; ++fd) {
    errno = 0;
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) ++open_fds;
  }
  CHECK_EQ(open_fds, 0);
  errno = 0;
  CHECK_EQ(::dup(limit - 1), -1);
  CHECK_EQ(errno, EBADF);
  say("closed");
  wait_for_go();
  const std::string path = dir + "/after-close.txt";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  CHECK_EQ(fd, 3);  // the lowest free number, as natively
  CHECK_EQ(write_all(fd, "after\n"), 1);
  CHECK_EQ(::close(fd), 0);
  return g_failures;
}

int run_sigterm() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  if (sigprocmask(SIG_BLOCK, &set, nullptr) != 0) return 1;
  const int sfd = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) return 1;
  say("ready");
  pollfd p{sfd, POLLIN, 0};
  if (::poll(&p, 1, 20000) != 1) {
    std::fprintf(stderr, "FAIL no SIGTERM on the signalfd\n");
    return 1;
  }
  signalfd_siginfo si{};
  CHECK_EQ(::read(sfd, &si, sizeof si), static_cast<long long>(sizeof si));
  CHECK_EQ(si.ssi_signo, SIGTERM);
  say("got SIGTERM, shutting down");
  return g_failures;
}

int run_sigchld(int n) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  if (sigprocmask(SIG_BLOCK, &set, nullptr) != 0) return 1;
  const int sfd = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) return 1;
  int seen = 0;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) ::_exit(0);
    pollfd p{sfd, POLLIN, 0};
    if (::poll(&p, 1, 2000) == 1) {
      signalfd_siginfo si{};
      if (::read(sfd, &si, sizeof si) == sizeof si && si.ssi_signo == SIGCHLD) ++seen;
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
  std::printf("seen %d of %d\n", seen, n);
  CHECK_EQ(seen, n);
  return g_failures;
}

int run_write(const std::string& dir) {
  const std::string path = dir + "/first.txt";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  CHECK_EQ(write_all(fd, "first\n"), 1);
  CHECK_EQ(::close(fd), 0);
  return g_failures;
}

int run_fcntl(const std::string& dir) {
  const std::string path = dir + "/fcntl.dat";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return 1;
  // No argument.
  CHECK_EQ(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  CHECK_EQ(::fcntl(fd, F_GETFL) & O_ACCMODE, O_RDWR);
  // An int.
  CHECK_EQ(::fcntl(fd, F_SETFD, FD_CLOEXEC), 0);
  CHECK_EQ(::fcntl(fd, F_GETFD), FD_CLOEXEC);
  CHECK_EQ(::fcntl(fd, F_SETFL, O_APPEND | O_NONBLOCK), 0);
  CHECK_EQ(::fcntl(fd, F_GETFL) & (O_APPEND | O_NONBLOCK), O_APPEND | O_NONBLOCK);
  const int d = ::fcntl(fd, F_DUPFD, 100);
  CHECK_EQ(d >= 100, 1);
  CHECK_EQ(::fcntl(d, F_GETFD), 0);
  const int dc = ::fcntl(fd, F_DUPFD_CLOEXEC, 200);
  CHECK_EQ(dc >= 200, 1);
  CHECK_EQ(::fcntl(dc, F_GETFD), FD_CLOEXEC);
  ::close(d);
  ::close(dc);
  // A pointer: record locks.
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 10;
  CHECK_EQ(::fcntl(fd, F_SETLK, &fl), 0);
  struct flock probe {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  probe.l_len = 10;
  CHECK_EQ(::fcntl(fd, F_GETLK, &probe), 0);
  CHECK_EQ(probe.l_type, F_UNLCK);  // our own lock does not conflict with us
  struct flock ofd {};
  ofd.l_type = F_RDLCK;
  ofd.l_whence = SEEK_SET;
  ofd.l_start = 20;
  ofd.l_len = 5;
  CHECK_EQ(::fcntl(fd, F_OFD_SETLK, &ofd), 0);
  struct f_owner_ex owner {};
  CHECK_EQ(::fcntl(fd, F_GETOWN_EX, &owner), 0);
  // Pipes and seals.
  int p[2];
  if (::pipe(p) != 0) return 1;
  CHECK_EQ(::fcntl(p[0], F_SETPIPE_SZ, 65536) >= 65536, 1);
  CHECK_EQ(::fcntl(p[0], F_GETPIPE_SZ) >= 65536, 1);
  const int m = ::memfd_create("probe", MFD_ALLOW_SEALING);
  CHECK_EQ(::fcntl(m, F_ADD_SEALS, F_SEAL_GROW), 0);
  CHECK_EQ(::fcntl(m, F_GET_SEALS), F_SEAL_GROW);
  // Errors.
  errno = 0;
  CHECK_EQ(::fcntl(987654, F_GETFD), -1);
  CHECK_EQ(errno, EBADF);
  errno = 0;
  CHECK_EQ(::fcntl(fd, 0x7fff), -1);
  CHECK_EQ(errno, EINVAL);
  ::close(m);
  ::close(p[0]);
  ::close(p[1]);
  ::close(fd);
  return g_failures;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s dup2-all|close-all|sigterm|sigchld|write|fcntl [DIR|N]\n",
                 argv[0]);
    return 2;
  }
  const std::string cmd = argv[1];
  const std::string arg = argc > 2 ? argv[2] : "/tmp";
  int failures = 0;
  if (cmd == "dup2-all") {
    failures = run_dup2_all(arg);
  } else if (cmd == "close-all") {
    failures = run_close_all(arg);
  } else if (cmd == "sigterm") {
    failures = run_sigterm();
  } else if (cmd == "sigchld") {
    failures = run_sigchld(argc > 2 ? std::atoi(argv[2]) : 50);
  } else if (cmd == "write") {
    failures = run_write(arg);
  } else if (cmd == "fcntl") {
    failures = run_fcntl(arg);
  } else {
    std::fprintf(stderr, "unknown scenario %s\n", cmd.c_str());
    return 2;
  }
  return failures != 0 ? 1 : 0;
}
