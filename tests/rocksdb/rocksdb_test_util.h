// Helpers shared by the RocksDB binding tests: a counting stage and its statistics, and
// opening a database (the temporary directory is tests/test_util.h's).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <rocksdb/db.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "sluice/stage.h"
#include "test_util.h"

namespace sluice_test {

// Every origin the binding emits, each with a channel of its own; inside a channel one
// noop object per operation class ("read", "write", everything else in "other").
// Requests of an origin without a channel ("compaction", "unknown", application
// origins) land in the default channel "rest", also split by operation.
inline nlohmann::json counting_rules() {
  const std::vector<std::string> origins = {
      "foreground", "wal",      "flush", "compaction_L0_L1", "compaction_L0_L0", "compaction_LN",
      "manifest",   "info_log", "other"};
  nlohmann::json rules = nlohmann::json::array();
  rules.push_back({{"rule", "differentiate"}, {"classifiers", {"origin"}}});
  auto add_channel = [&](const std::string& name, const nlohmann::json* match) {
    nlohmann::json ch = {{"rule", "create_channel"}, {"channel", name}};
    if (match != nullptr) {
      ch["match"] = *match;
    } else {
      ch["default"] = true;
    }
    rules.push_back(ch);
    rules.push_back({{"rule", "differentiate"}, {"channel", name}, {"classifiers", {"operation"}}});
    rules.push_back({{"rule", "create_object"},
                     {"channel", name},
                     {"object", "read"},
                     {"type", "noop"},
                     {"match", {{"operation", "read"}}}});
    rules.push_back({{"rule", "create_object"},
                     {"channel", name},
                     {"object", "write"},
                     {"type", "noop"},
                     {"match", {{"operation", "write"}}}});
    rules.push_back({{"rule", "create_object"},
                     {"channel", name},
                     {"object", "other"},
                     {"type", "noop"},
                     {"default", true}});
  };
  for (const auto& o : origins) {
    const nlohmann::json m = {{"origin", o}};
    add_channel(o, &m);
  }
  add_channel("rest", nullptr);
  return rules;
}

inline std::unique_ptr<sluice::Stage> counting_stage(const std::string& name = "rocksdb-test") {
  sluice::StageOptions so;
  so.name = name;
  auto st = sluice::Stage::create(so);
  REQUIRE(st.is_ok());
  auto stage = std::move(st).value();
  const sluice::Status s = stage->apply(counting_rules());
  INFO(s.to_string());
  REQUIRE(s.is_ok());
  return stage;
}

// Bytes of operation class `object` ("read", "write", "other") with origin `origin`,
// summed over every channel (stats accumulated by the caller over several collects).
struct Tally {
  std::map<std::string, std::map<std::string, std::uint64_t>> bytes;  // origin -> op -> B
  std::map<std::string, std::map<std::string, std::uint64_t>> ops;

  void add(const sluice::StageStats& s) {
    for (const auto& ch : s.channels) {
      for (const auto& obj : ch.objects) {
        for (const auto& [origin, c] : obj.by_origin) {
          bytes[origin][obj.name] += c.bytes;
          ops[origin][obj.name] += c.ops;
        }
      }
    }
  }
  std::uint64_t get(const std::string& origin, const std::string& op) const {
    auto it = bytes.find(origin);
    if (it == bytes.end()) return 0;
    auto jt = it->second.find(op);
    return jt == it->second.end() ? 0 : jt->second;
  }
  std::uint64_t compaction(const std::string& op) const {
    return get("compaction_L0_L1", op) + get("compaction_L0_L0", op) + get("compaction_LN", op) +
           get("compaction", op);
  }
};

using TempDir = sluice::testing::TempDir;

// Opens the database at `path` with `o`; the test fails (with RocksDB's reason) if it
// cannot.
inline std::unique_ptr<rocksdb::DB> open_db(const rocksdb::Options& o, const std::string& path) {
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status s = rocksdb::DB::Open(o, path, &raw);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return std::unique_ptr<rocksdb::DB>(raw);
}

}  // namespace sluice_test
