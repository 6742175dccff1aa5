// Statistics a stage reports on collect: per channel, per object and per
// origin, as deltas since the previous collect.
//
// The hot path counts into per-thread shards (libstage/src/stage_stats.h);
// collect folds them. These structs are the folded, plain-value form, with
// JSON conversion for the wire and for policies.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/context.h"
#include "sluice/status.h"

namespace sluice {

// Log2 histogram of wait times. Bucket 0 counts requests that did not wait;
// bucket k >= 1 counts waits in [2^(k-1), 2^k) microseconds, the last bucket
// everything longer.
inline constexpr int kWaitBuckets = 24;

struct WaitStats {
  std::array<std::uint64_t, kWaitBuckets> buckets{};
  std::uint64_t total_ns = 0;

  std::uint64_t count() const noexcept;
  // The wait (ns) below which `q` (0..1) of the requests fall: the upper edge
  // of the bucket holding the quantile; 0 when nothing waited.
  std::uint64_t quantile_ns(double q) const noexcept;
  void add(const WaitStats& o) noexcept;
  static int bucket_of(std::uint64_t wait_ns) noexcept;
};

struct Counters {
  std::uint64_t ops = 0;
  std::uint64_t bytes = 0;
  void add(const Counters& o) noexcept {
    ops += o.ops;
    bytes += o.bytes;
  }
};

struct ObjectStats {
  std::string name;
  std::string type;
  Counters total;
  std::map<std::string, Counters> by_origin;  // origin name -> counters
  WaitStats wait;
  std::uint64_t cancelled = 0;  // requests that returned Outcome::kCancelled
  std::uint64_t rejected = 0;
  nlohmann::json state;  // EnforcementObject::collect()
};

struct ChannelStats {
  std::string name;
  Counters total;  // the channel's objects plus requests no object took
  std::map<std::string, Counters> by_origin;
  WaitStats wait;
  std::vector<ObjectStats> objects;
};

struct StageStats {
  std::string stage;
  std::int64_t interval_ns = 0;  // time covered by these deltas
  std::int64_t collected_at_ns = 0;
  Counters total;
  Counters unclassified;  // requests that matched no channel (passed through)
  std::vector<ChannelStats> channels;

  const ChannelStats* channel(std::string_view name) const noexcept;
};

void to_json(nlohmann::json& j, const WaitStats& s);
void to_json(nlohmann::json& j, const Counters& s);
void to_json(nlohmann::json& j, const ObjectStats& s);
void to_json(nlohmann::json& j, const ChannelStats& s);
void to_json(nlohmann::json& j, const StageStats& s);
// Parsing for policies and tools; errors name the field.
StatusOr<StageStats> stage_stats_from_json(const nlohmann::json& j);

}  // namespace sluice
