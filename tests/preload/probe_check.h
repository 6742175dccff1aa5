// The self-check of the probe programs (probe.cc, host_probe.cc), which run
// under the preload without a test framework: CHECK_EQ prints a "FAIL ..."
// line on stderr and counts it in g_failures, which the program's exit
// status reports. Single-threaded use (a probe's checks run on its main
// thread).
#pragma once

#include <cstdio>

inline int g_failures = 0;

#define CHECK_EQ(a, b)                                                                          \
  do {                                                                                          \
    long long va_ = static_cast<long long>(a), vb_ = static_cast<long long>(b);                 \
    if (va_ != vb_) {                                                                           \
      std::fprintf(stderr, "FAIL %s:%d: %s == %lld, expected %s == %lld\n", __FILE__, __LINE__, \
                   #a, va_, #b, vb_);                                                           \
      ++g_failures;                                                                             \
    }                                                                                           \
  } while (0)
