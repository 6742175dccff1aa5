// What the SILK tests share: stage views of a RocksDB under load, the
// policy's input, and the batches it should send.
#pragma once

#include "silk.h"

#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace sluice {
namespace {

using nlohmann::json;

using sluice::testing::kMiB;
using sluice::testing::kSecond;

// ---------------------------------------------------------------------------
// Building the policy's input.

inline ChannelStats& stats_channel(StageView& st, const std::string& channel) {
  for (auto& c : st.stats.channels) {
    if (c.name == channel) return c;
  }
  st.stats.channels.push_back({});
  st.stats.channels.back().name = channel;
  return st.stats.channels.back();
}

inline ChannelInfo& info_channel(StageView& st, const std::string& channel) {
  for (auto& c : st.info.channels) {
    if (c.name == channel) return c;
  }
  st.info.channels.push_back({});
  st.info.channels.back().name = channel;
  return st.info.channels.back();
}

// An object that moved `bytes` of `origin` in the last interval (1 s), with
// `waiters` requests queued at collect time.
void add_object(StageView& st, const std::string& channel, const std::string& object,
                const std::string& origin, std::uint64_t bytes, std::uint64_t waiters = 0,
                const std::string& type = "drl") {
  ChannelStats& c = stats_channel(st, channel);
  ObjectStats* o = nullptr;
  for (auto& existing : c.objects) {
    if (existing.name == object) o = &existing;
  }
  if (o == nullptr) {
    c.objects.push_back({});
    o = &c.objects.back();
    o->name = object;
    o->type = type;
    o->state = {{"waiters", 0}};
    ChannelInfo& ci = info_channel(st, channel);
    ObjectInfo oi;
    oi.name = object;
    oi.type = type;
    oi.match = json::array();
    ci.objects.push_back(std::move(oi));
  }
  if (bytes > 0) {
    o->total.add({bytes / 4096 + 1, bytes});
    o->by_origin[origin].add({bytes / 4096 + 1, bytes});
    c.total.add({bytes / 4096 + 1, bytes});
    c.by_origin[origin].add({bytes / 4096 + 1, bytes});
    st.stats.total.add({bytes / 4096 + 1, bytes});
  }
  o->state["waiters"] = o->state["waiters"].get<std::uint64_t>() + waiters;
}

// What a RocksDB instance did in one second, in MiB, under the default layout.
struct Load {
  double fg = 0;
  double flush = 0;
  double l0 = 0;
  double ln = 0;
  std::uint64_t flush_waiters = 0;
  std::uint64_t l0_waiters = 0;
  std::uint64_t ln_waiters = 0;
};

inline std::uint64_t mib(double v) {
  return static_cast<std::uint64_t>(v * kMiB);
}

inline StageView rocksdb_stage(const std::string& name, const Load& load,
                               std::int64_t connected = 1) {
  StageView st;
  st.name = name;
  st.connected_at_ns = connected;
  st.info.name = name;
  st.info.classifiers = {"origin"};
  st.stats.stage = name;
  st.stats.interval_ns = kSecond;
  add_object(st, "foreground", "monitor", "foreground", mib(load.fg), 0, "noop");
  add_object(st, "flush", "limit", "flush", mib(load.flush), load.flush_waiters);
  add_object(st, "compaction_l0", "limit", "compaction_L0_L1", mib(load.l0), load.l0_waiters);
  add_object(st, "compaction_ln", "limit", "compaction_LN", mib(load.ln), load.ln_waiters);
  return st;
}

inline PolicyInput silk_input_of(std::vector<StageView> stages,
                                 std::vector<std::string> departed = {}) {
  PolicyInput in;
  in.now_ns = 10 * kSecond;
  in.interval_ns = kSecond;
  in.stages = std::move(stages);
  in.departed = std::move(departed);
  return in;
}

inline json configure(const std::string& channel, const std::string& object, std::int64_t rate) {
  return {{"rule", "configure"},
          {"channel", channel},
          {"object", object},
          {"config", {{"rate", rate}}}};
}

inline json batch(json rules) {
  return {{"version", 1}, {"rules", std::move(rules)}};
}

// batch({rule, ...}): the rules as an array, one rule or many (a braced list
// of one json is that json itself to clang, an array to g++).
inline json batch(std::initializer_list<json> rules) {
  json list = json::array();
  for (const json& r : rules) list.push_back(r);
  return batch(std::move(list));
}

inline json three_rates(std::int64_t flush, std::int64_t l0, std::int64_t ln) {
  return batch({configure("flush", "limit", flush), configure("compaction_l0", "limit", l0),
                configure("compaction_ln", "limit", ln)});
}

inline SilkPolicy make_silk(const json& config) {
  SilkPolicy p;
  const Status s = p.configure(config);
  INFO(s.to_string());
  REQUIRE(s.is_ok());
  return p;
}

const json kPaper = {{"kvs_bandwidth", 200 * kMiB}, {"min_bandwidth", 10 * kMiB}};

inline json target(const std::string& channel, const std::string& object, const std::string& dir) {
  return {{"channel", channel}, {"object", object}, {"direction", dir}};
}

// KVS_B 200 MiB/s read and 100 MiB/s write; min_B 10 and 5.
inline json directional_config() {
  return {
      {"kvs_bandwidth", 200 * kMiB},
      {"min_bandwidth", 10 * kMiB},
      {"directions",
       {{"read",
         {{"kvs_bandwidth", 200 * kMiB},
          {"min_bandwidth", 10 * kMiB},
          {"foreground", {{{"channel", "foreground"}, {"object", "read"}}}}}},
        {"write",
         {{"kvs_bandwidth", 100 * kMiB},
          {"min_bandwidth", 5 * kMiB},
          {"foreground", {{{"channel", "foreground"}, {"object", "write"}}}}}}}},
      {"foreground", {{"channels", {"foreground"}}}},
      {"flush",
       {{"origins", {"flush"}},
        {"objects", {target("flush", "read", "read"), target("flush", "write", "write")}}}},
      {"l0",
       {{"origins", {"compaction_L0_L1", "compaction_L0_L0"}},
        {"objects",
         {target("compaction", "l0_read", "read"), target("compaction", "l0_write", "write")}}}},
      {"ln",
       {{"origins", {"compaction_LN"}},
        {"objects",
         {target("compaction", "ln_read", "read"), target("compaction", "ln_write", "write")}}}}};
}

}  // namespace
}  // namespace sluice
