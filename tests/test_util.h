// Helpers the Catch2 tests share: a temporary directory that removes itself,
// a bounded wait for an event another thread or process brings about (never
// a way to learn what an injected clock could tell), reading a file whole,
// and the environment and argument vectors of a child program run with or
// without the preload. Single-threaded use: each test owns what it makes.
#pragma once

#include <errno.h>
#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

extern char** environ;

// Which sanitizer instruments the tests, as g++ (__SANITIZE_*__) and clang
// (__has_feature) each say it: SLUICE_TEST_ASAN, SLUICE_TEST_TSAN, 1 or 0.
#if defined(__SANITIZE_ADDRESS__)
#define SLUICE_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLUICE_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define SLUICE_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SLUICE_TEST_TSAN 1
#endif
#endif
#ifndef SLUICE_TEST_ASAN
#define SLUICE_TEST_ASAN 0
#endif
#ifndef SLUICE_TEST_TSAN
#define SLUICE_TEST_TSAN 0
#endif

namespace sluice::testing {

// The tests' units, in the stage's (nanoseconds, bytes). A test room compiled
// in unity batches takes them from here rather than defining its own.
inline constexpr std::int64_t kUs = 1'000;
inline constexpr std::int64_t kMs = 1'000'000;
inline constexpr std::int64_t kSecond = 1'000'000'000;
inline constexpr std::int64_t kMiB = 1024 * 1024;
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// A fresh directory <root>/sluice-<tag>-XXXXXX, removed with what it holds.
// <root> is $TMPDIR, else /tmp; the tag defaults to the test program's name.
struct TempDir {
  explicit TempDir(const std::string& tag = program_invocation_short_name) {
    const char* root = std::getenv("TMPDIR");
    std::string tmpl = std::string(root != nullptr && *root != '\0' ? root : "/tmp") + "/sluice-" +
                       tag + "-XXXXXX";
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() { (void)std::system(("rm -rf '" + path + "'").c_str()); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path + "/" + name; }
  // Creates (or replaces) the file `name` holding `text`; returns its path.
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = file(name);
    std::ofstream(p) << text;
    return p;
  }
  std::string path;
};

// True as soon as `pred` holds, polling every 2 ms; false if it still does
// not after `timeout`. A predicate that asks a server (etcd) polls less often.
inline bool wait_for(const std::function<bool()>& pred, std::chrono::milliseconds timeout,
                     std::chrono::milliseconds every = std::chrono::milliseconds(2)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(every);
  }
  return pred();
}

// Polls `done` (yielding the CPU) until it holds; fails the test after
// `give_up` of real time, which only a hang would take, however loaded the
// machine or slow the sanitizer. For what another thread brings about, never
// for what an injected clock can tell.
template <typename Pred>
void eventually(Pred done, std::chrono::seconds give_up = std::chrono::seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + give_up;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) {
      FAIL("gave up waiting after " << give_up.count() << " s");
    }
    std::this_thread::yield();
  }
}

// The whole contents of the file at `path` ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// What LD_PRELOAD must name to load `lib` into a program: `lib`, after
// `sanitizer_runtime` when the tests are sanitized (a sanitizer wants its
// runtime first in the library list).
inline std::string preload_list(const std::string& lib, const std::string& sanitizer_runtime) {
  return sanitizer_runtime.empty() ? lib : sanitizer_runtime + ":" + lib;
}

// The environment of a child program: this process's without any SLUICE_*
// variable or LD_PRELOAD; then, when `preload` is not empty,
// LD_PRELOAD=`preload` and the variables of `set`.
inline std::vector<std::string> child_env(const std::string& preload,
                                          const std::map<std::string, std::string>& set) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string s(*e);
    if (s.rfind("SLUICE_", 0) == 0 || s.rfind("LD_PRELOAD=", 0) == 0) continue;
    env.push_back(s);
  }
  if (!preload.empty()) {
    env.push_back("LD_PRELOAD=" + preload);
    for (const auto& [k, v] : set) env.push_back(k + "=" + v);
  }
  return env;
}

// `strings` as an argv/envp array: their pointers, then a null (valid while
// `strings` lives unchanged).
inline std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace sluice::testing
