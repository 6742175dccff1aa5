// What the drl tests share: the names they use, a request of a size, and the
// bucket's queue length.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "sluice/clock.h"
#include "sluice/objects/drl.h"
#include "test_util.h"

namespace {

using nlohmann::json;
using sluice::Drl;
using sluice::DrlConfig;
using sluice::FastGrant;
using sluice::ManualClock;
using sluice::Outcome;
using sluice::SimClock;
using sluice::Verdict;
using sluice::testing::eventually;
using sluice::testing::kSecond;

inline sluice::Context sized(std::uint64_t size) {
  sluice::Context ctx;
  ctx.size = size;
  return ctx;
}

inline Verdict enforce(Drl& drl, std::uint64_t size) {
  return drl.enforce_context(sized(size));
}

inline std::uint64_t waiters(const Drl& drl) {
  return drl.collect()["waiters"].get<std::uint64_t>();
}

}  // namespace
