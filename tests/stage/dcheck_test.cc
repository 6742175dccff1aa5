// SLUICE_DCHECK in a build without NDEBUG: a false condition reports where
// and what, then aborts; a true one costs nothing else. This file turns the
// checks on whatever the build type; dcheck_off_test.cc checks them off.
#undef NDEBUG

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include <catch2/catch.hpp>

#include "sluice/dcheck.h"

namespace {

struct Child {
  int status = 0;
  std::string err;  // what it wrote to stderr
};

// Runs fn() in a forked child, with stderr captured and SIGABRT's default
// action (not the test runner's handler); the child exits 0 when fn() returns.
Child run_in_child(void (*fn)()) {
  int p[2];
  REQUIRE(::pipe(p) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::signal(SIGABRT, SIG_DFL);
    ::dup2(p[1], STDERR_FILENO);
    ::close(p[0]);
    fn();
    ::_exit(0);
  }
  ::close(p[1]);
  Child c;
  char buf[512];
  for (;;) {
    const ssize_t n = ::read(p[0], buf, sizeof buf);
    if (n <= 0) break;
    c.err.append(buf, static_cast<std::size_t>(n));
  }
  ::close(p[0]);
  REQUIRE(::waitpid(pid, &c.status, 0) == pid);
  return c;
}

int g_items = 3;
int g_capacity = 2;

constexpr int kFailingLine = __LINE__ + 2;
void over_capacity() {
  SLUICE_DCHECK(g_items <= g_capacity, "a queue holds at most its capacity");
}

void within_capacity() {
  SLUICE_DCHECK(g_items <= g_capacity + 1, "a queue holds at most its capacity");
}

}  // namespace

TEST_CASE("A broken invariant aborts with the place and the message", "[dcheck]") {
  const Child c = run_in_child(over_capacity);
  REQUIRE(WIFSIGNALED(c.status));
  CHECK(WTERMSIG(c.status) == SIGABRT);
  const std::string where = "dcheck_test.cc:" + std::to_string(kFailingLine) + ": ";
  CHECK_THAT(c.err,
             Catch::Contains(where + "invariant broken: a queue holds at most its capacity"));
  CHECK_THAT(c.err, Catch::Contains("(g_items <= g_capacity)"));
}

TEST_CASE("A kept invariant neither aborts nor prints", "[dcheck]") {
  const Child c = run_in_child(within_capacity);
  REQUIRE(WIFEXITED(c.status));
  CHECK(WEXITSTATUS(c.status) == 0);
  CHECK(c.err.empty());
}

TEST_CASE("A checked condition is evaluated once", "[dcheck]") {
  int evaluated = 0;
  auto holds = [&evaluated] {
    ++evaluated;
    return true;
  };
  SLUICE_DCHECK(holds(), "holds");
  CHECK(evaluated == 1);
}
