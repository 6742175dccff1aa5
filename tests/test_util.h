// Helpers the control and preload tests share: a temporary directory that
// removes itself, and a bounded wait for an event another thread or process
// brings about (never a way to learn what an injected clock could tell).
#pragma once

#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

namespace sluice::testing {

// A fresh directory /tmp/sluice-<tag>-XXXXXX, removed with what it holds.
struct TempDir {
  explicit TempDir(const std::string& tag) {
    std::string tmpl = "/tmp/sluice-" + tag + "-XXXXXX";
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() { (void)std::system(("rm -rf '" + path + "'").c_str()); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path + "/" + name; }
  std::string path;
};

// True as soon as `pred` holds, polling every 2 ms; false if it still does
// not after `timeout`.
inline bool wait_for(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

}  // namespace sluice::testing
