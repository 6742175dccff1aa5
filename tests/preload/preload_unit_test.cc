// Unit tests of the preload's configuration parsing and fd classification
// (preload/config.cc, preload/fd_table.cc), in-process, no LD_PRELOAD.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "preload.h"
#include "sluice/stage.h"
#include "test_util.h"

using namespace sluice::preload;

namespace {

// parse_config reads the environment through a function pointer; tests feed
// it from this map.
std::map<std::string, std::string>* g_env = nullptr;
const char* fake_env(const char* name) {
  auto it = g_env->find(name);
  return it == g_env->end() ? nullptr : it->second.c_str();
}

sluice::StatusOr<Config> parse(std::map<std::string, std::string> env) {
  g_env = &env;
  auto c = parse_config(&fake_env, "myprog", 4242);
  g_env = nullptr;
  return c;
}

std::string error_of(std::map<std::string, std::string> env) {
  auto c = parse(std::move(env));
  REQUIRE_FALSE(c.is_ok());
  return c.status().message();
}

using sluice::testing::TempDir;

}  // namespace

TEST_CASE("configuration defaults", "[preload][config]") {
  auto c = parse({});
  REQUIRE(c.is_ok());
  CHECK(c->stage_name == "myprog-4242");
  CHECK(c->socket_path.empty());
  CHECK(c->rules_path.empty());
  CHECK(c->paths.empty());
  CHECK(c->kinds == kind_bit(FileKind::kRegular));
  CHECK(c->log_level == LogLevel::kWarn);
  CHECK(c->fork_mode == ForkMode::kFresh);
  CHECK_FALSE(c->tenant.has_value());
  CHECK(c->stats_file.empty());
}

TEST_CASE("configuration values", "[preload][config]") {
  auto c = parse({{"SLUICE_STAGE", "db-1"},
                  {"SLUICE_SOCKET", "/run/sluice.sock"},
                  {"SLUICE_RULES", "/etc/rules.json"},
                  {"SLUICE_PATHS", "/nonexistent-a/:/nonexistent-b::/"},
                  {"SLUICE_KINDS", "regular,pipe,socket"},
                  {"SLUICE_LOG_LEVEL", "debug"},
                  {"SLUICE_FORK", "passthrough"},
                  {"SLUICE_TENANT", "4294967295"},
                  {"SLUICE_ORIGIN", "foreground"},
                  {"SLUICE_STATS_FILE", "/tmp/s.%p.json"}});
  REQUIRE(c.is_ok());
  CHECK(c->stage_name == "db-1");
  CHECK(c->socket_path == "/run/sluice.sock");
  CHECK(c->rules_path == "/etc/rules.json");
  REQUIRE(c->paths.size() == 3);
  CHECK(c->paths[0] == "/nonexistent-a");
  CHECK(c->paths[1] == "/nonexistent-b");
  CHECK(c->paths[2] == "/");
  CHECK(c->kinds ==
        (kind_bit(FileKind::kRegular) | kind_bit(FileKind::kPipe) | kind_bit(FileKind::kSocket)));
  CHECK(c->log_level == LogLevel::kDebug);
  CHECK(c->fork_mode == ForkMode::kPassthrough);
  REQUIRE(c->tenant.has_value());
  CHECK(*c->tenant == 4294967295u);
  CHECK(c->origin == "foreground");
  CHECK(c->stats_file == "/tmp/s.%p.json");
}

TEST_CASE("SLUICE_KINDS=all selects every kind", "[preload][config]") {
  auto c = parse({{"SLUICE_KINDS", "all"}});
  REQUIRE(c.is_ok());
  for (FileKind k : {FileKind::kRegular, FileKind::kDir, FileKind::kSocket, FileKind::kPipe,
                     FileKind::kTty, FileKind::kOther}) {
    CHECK((c->kinds & kind_bit(k)) != 0);
  }
}

TEST_CASE("SLUICE_KINDS names each kind as kind_name does, and all is exactly those",
          "[preload][config]") {
  std::uint8_t every = 0;
  for (FileKind k : {FileKind::kRegular, FileKind::kDir, FileKind::kSocket, FileKind::kPipe,
                     FileKind::kTty, FileKind::kOther}) {
    INFO(kind_name(k));
    auto c = parse({{"SLUICE_KINDS", std::string(kind_name(k))}});
    REQUIRE(c.is_ok());
    CHECK(c->kinds == kind_bit(k));
    every |= kind_bit(k);
  }
  CHECK(every == 0x7e);
  auto all = parse({{"SLUICE_KINDS", "all"}});
  REQUIRE(all.is_ok());
  CHECK(all->kinds == every);
  CHECK(kind_name(FileKind::kUnknown) == "unknown");
  CHECK_FALSE(parse({{"SLUICE_KINDS", "unknown"}}).is_ok());
}

TEST_CASE("each invalid variable gives one message naming it", "[preload][config]") {
  CHECK(error_of({{"SLUICE_LOG_LEVEL", "loud"}}) ==
        "SLUICE_LOG_LEVEL=loud: expected one of off, error, warn, info, debug");
  CHECK(error_of({{"SLUICE_STAGE", "bad name"}}).rfind("SLUICE_STAGE=bad name: ", 0) == 0);
  CHECK(error_of({{"SLUICE_STAGE", ""}}).rfind("SLUICE_STAGE=: ", 0) == 0);
  CHECK(error_of({{"SLUICE_STAGE", std::string(sluice::kMaxStageNameLength + 1, 'x')}})
            .rfind("SLUICE_STAGE=xxx", 0) == 0);
  // The rule is the stage's own (sluice::valid_stage_name): its longest name
  // and its '@' and '+' pass.
  CHECK(parse({{"SLUICE_STAGE", std::string(sluice::kMaxStageNameLength, 'x')}}).is_ok());
  CHECK(parse({{"SLUICE_STAGE", "user@host+db"}}).is_ok());
  CHECK(error_of({{"SLUICE_SOCKET", "/" + std::string(200, 's')}}).rfind("SLUICE_SOCKET=/", 0) ==
        0);
  CHECK(error_of({{"SLUICE_PATHS", "/ok:relative/dir"}}) ==
        "SLUICE_PATHS=/ok:relative/dir: 'relative/dir' is not an absolute directory (paths are "
        "colon-separated absolute prefixes)");
  CHECK(error_of({{"SLUICE_KINDS", "regular,files"}})
            .rfind("SLUICE_KINDS=regular,files: unknown kind 'files'", 0) == 0);
  CHECK(error_of({{"SLUICE_FORK", "sometimes"}}) ==
        "SLUICE_FORK=sometimes: expected fresh or passthrough");
  CHECK(error_of({{"SLUICE_TENANT", "-1"}}) ==
        "SLUICE_TENANT=-1: expected an integer in 0..4294967295");
  CHECK(error_of({{"SLUICE_TENANT", "4294967296"}}).rfind("SLUICE_TENANT=4294967296: ", 0) == 0);
  CHECK(error_of({{"SLUICE_TENANT", "12abc"}}).rfind("SLUICE_TENANT=12abc: ", 0) == 0);
  CHECK(error_of({{"SLUICE_ORIGIN", "not valid!"}}).rfind("SLUICE_ORIGIN=not valid!: ", 0) == 0);
}

TEST_CASE("a relative SLUICE_SOCKET is refused", "[preload][config]") {
  // It would name another socket once the program changes directory.
  for (const char* path : {"rel.sock", "./rel.sock", "../run/sluice.sock"}) {
    CHECK(error_of({{"SLUICE_SOCKET", path}}) ==
          std::string("SLUICE_SOCKET=") + path +
              ": must be an absolute path (a relative one names another socket once the program "
              "changes directory)");
  }
}

TEST_CASE("a secure-execution process ignores every SLUICE_* variable", "[preload][config]") {
  // A setuid program (the preload installed in /etc/ld.so.preload) must not
  // read a rules file, write a stats file or connect to a socket its caller
  // names.
  std::map<std::string, std::string> env = {
      {"SLUICE_STAGE", "evil"},        {"SLUICE_SOCKET", "/tmp/evil.sock"},
      {"SLUICE_RULES", "/etc/shadow"}, {"SLUICE_PATHS", "/etc"},
      {"SLUICE_KINDS", "all"},         {"SLUICE_LOG_LEVEL", "debug"},
      {"SLUICE_FORK", "passthrough"},  {"SLUICE_TENANT", "7"},
      {"SLUICE_ORIGIN", "wal"},        {"SLUICE_STATS_FILE", "/etc/cron.d/sluice"}};
  g_env = &env;
  auto secure = parse_config(&fake_env, "su", 4242, /*secure=*/true);
  auto ordinary = parse_config(&fake_env, "su", 4242, /*secure=*/false);
  g_env = nullptr;
  REQUIRE(secure.is_ok());
  CHECK(secure->stage_name == "su-4242");
  CHECK(secure->socket_path.empty());
  CHECK(secure->rules_path.empty());
  CHECK(secure->stats_file.empty());
  CHECK(secure->paths.empty());
  CHECK(secure->kinds == kind_bit(FileKind::kRegular));
  CHECK(secure->log_level == LogLevel::kWarn);
  CHECK(secure->fork_mode == ForkMode::kFresh);
  CHECK_FALSE(secure->tenant.has_value());
  CHECK(secure->origin.empty());
  // An invalid value is not even looked at.
  env["SLUICE_TENANT"] = "not a number";
  g_env = &env;
  CHECK(parse_config(&fake_env, "su", 4242, /*secure=*/true).is_ok());
  g_env = nullptr;
  // The same environment in an ordinary process is read.
  REQUIRE(ordinary.is_ok());
  CHECK(ordinary->rules_path == "/etc/shadow");
  CHECK(ordinary->stats_file == "/etc/cron.d/sluice");
}

TEST_CASE("SLUICE_READY_MS: the first enforced call's wait for the first rules",
          "[preload][config]") {
  auto c = parse({});
  REQUIRE(c.is_ok());
  CHECK(c->ready_ms == 200);
  c = parse({{"SLUICE_READY_MS", "0"}});
  REQUIRE(c.is_ok());
  CHECK(c->ready_ms == 0);
  c = parse({{"SLUICE_READY_MS", "60000"}});
  REQUIRE(c.is_ok());
  CHECK(c->ready_ms == 60000);
  CHECK(error_of({{"SLUICE_READY_MS", "60001"}}) ==
        "SLUICE_READY_MS=60001: expected milliseconds in 0..60000 (0: do not wait)");
  CHECK(error_of({{"SLUICE_READY_MS", "-1"}}).rfind("SLUICE_READY_MS=-1: ", 0) == 0);
  CHECK(error_of({{"SLUICE_READY_MS", "1s"}}).rfind("SLUICE_READY_MS=1s: ", 0) == 0);
}

TEST_CASE("path_under matches whole components", "[preload][config]") {
  CHECK(path_under("/data/db/1.sst", "/data"));
  CHECK(path_under("/data", "/data"));
  CHECK_FALSE(path_under("/database/x", "/data"));
  CHECK_FALSE(path_under("/dat", "/data"));
  CHECK(path_under("/anything", "/"));
  CHECK_FALSE(path_under("pipe:[123]", "/"));
}

TEST_CASE("classify_fd tells kinds apart", "[preload][fd]") {
  TempDir dir;
  FdPolicy all{0x7e, {}};
  std::string file = dir.path + "/f";
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  std::uint8_t e = classify_fd(fd, all);
  CHECK((e & kEntryKnown) != 0);
  CHECK((e & kEntrySelected) != 0);
  CHECK(entry_kind(e) == FileKind::kRegular);

  int d = ::open(dir.path.c_str(), O_RDONLY | O_DIRECTORY);
  CHECK(entry_kind(classify_fd(d, all)) == FileKind::kDir);
  int p[2];
  REQUIRE(::pipe(p) == 0);
  CHECK(entry_kind(classify_fd(p[0], all)) == FileKind::kPipe);
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  CHECK(entry_kind(classify_fd(sv[0], all)) == FileKind::kSocket);
  int null = ::open("/dev/null", O_RDONLY);
  CHECK(entry_kind(classify_fd(null, all)) == FileKind::kOther);

  // Default policy: regular files only.
  FdPolicy regular;
  CHECK((classify_fd(fd, regular) & kEntrySelected) != 0);
  CHECK((classify_fd(p[0], regular) & kEntrySelected) == 0);
  CHECK((classify_fd(sv[0], regular) & kEntrySelected) == 0);
  CHECK((classify_fd(d, regular) & kEntrySelected) == 0);

  // A closed fd is not classified, and errno is preserved.
  int closed = ::dup(fd);
  ::close(closed);
  errno = 1234;
  CHECK(classify_fd(closed, all) == 0);
  CHECK(errno == 1234);
  CHECK(classify_fd(-1, all) == 0);

  for (int x : {fd, d, p[0], p[1], sv[0], sv[1], null}) ::close(x);
}

TEST_CASE("classify_fd applies path prefixes to regular files", "[preload][fd]") {
  TempDir a, b;
  char* real_a = ::realpath(a.path.c_str(), nullptr);
  REQUIRE(real_a != nullptr);
  FdPolicy under_a{kind_bit(FileKind::kRegular) | kind_bit(FileKind::kPipe), {real_a}};
  std::free(real_a);
  int fa = ::open((a.path + "/x").c_str(), O_RDWR | O_CREAT, 0644);
  int fb = ::open((b.path + "/x").c_str(), O_RDWR | O_CREAT, 0644);
  int p[2];
  REQUIRE(::pipe(p) == 0);
  CHECK((classify_fd(fa, under_a) & kEntrySelected) != 0);
  CHECK((classify_fd(fb, under_a) & kEntrySelected) == 0);
  CHECK((classify_fd(p[1], under_a) & kEntrySelected) != 0);  // no path: kind decides
  for (int x : {fa, fb, p[0], p[1]}) ::close(x);
}

TEST_CASE("FdTable caches, forgets and ignores fds outside it", "[preload][fd]") {
  TempDir dir;
  auto table = std::make_unique<FdTable<256>>();
  int fd = ::open((dir.path + "/t").c_str(), O_RDWR | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(fd < 256);
  // No policy yet: nothing resolves (calls before initialisation pass through).
  CHECK(table->lookup(fd) == 0);
  CHECK(table->peek(fd) == 0);
  FdPolicy policy;
  table->set_policy(&policy);
  std::uint8_t e = table->lookup(fd);
  CHECK((e & kEntrySelected) != 0);
  CHECK(table->peek(fd) == e);
  // A cached entry is not re-resolved: after close it still answers until forgotten.
  ::close(fd);
  CHECK(table->lookup(fd) == e);
  table->forget(fd);
  CHECK(table->peek(fd) == 0);
  CHECK(table->lookup(fd) == 0);  // closed: stays unknown
  // record() re-classifies: the same number now a pipe.
  int p[2];
  REQUIRE(::pipe(p) == 0);
  CHECK(entry_kind(table->record(p[0])) == FileKind::kPipe);
  CHECK((table->lookup(p[0]) & kEntrySelected) == 0);
  table->forget_range(0, ~0u);
  CHECK(table->peek(p[0]) == 0);
  CHECK(table->lookup(-1) == 0);
  CHECK(table->lookup(100000) == 0);
  ::close(p[0]);
  ::close(p[1]);
}
