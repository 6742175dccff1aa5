// The CLI's connection trusts only a daemon run by root or by its own user
// (control-plane/client.h), as a stage does: another uid serving on the
// socket path must not receive `policy set` with the rules files inlined.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <string>

#include <catch2/catch.hpp>

#include "client.h"
#include "test_util.h"

TEST_CASE("a connection refuses a socket served by another user", "[client][peer]") {
  if (::geteuid() != 0) {
    WARN("not root: cannot serve a socket as another user here; not checked");
    return;
  }
  sluice::testing::TempDir dir("peer");
  REQUIRE(::chmod(dir.path.c_str(), 0777) == 0);
  const std::string path = dir.file("squatter.sock");
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // the squatter: nobody, listening on the path
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(1);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 4) != 0)
      ::_exit(1);
    (void)!::write(ready[1], "r", 1);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  ::close(ready[0]);
  auto conn = sluice::control::Connection::open(path);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  REQUIRE_FALSE(conn.is_ok());
  CHECK(conn.status().code() == sluice::Code::kPermissionDenied);
  CHECK(conn.status().message() ==
        "the process serving " + path +
            " runs as uid 65534, neither root nor you (uid 0): not talking to it (choose the "
            "daemon's socket with --socket)");
}
