// The pass-through stage the RocksDB overhead benches put under RocksDB: a channel
// per origin the binding assigns, each with a noop object that counts, plus a default
// channel (the same layout bench/rocksdb_overhead.sh writes for db_bench).
#pragma once

#include <nlohmann/json.hpp>

namespace sluice::bench {

inline nlohmann::json per_origin_noop_rules() {
  nlohmann::json rules = nlohmann::json::array();
  rules.push_back({{"rule", "differentiate"}, {"classifiers", {"origin"}}});
  for (const char* o : {"foreground", "wal", "flush", "compaction", "compaction_L0_L1",
                        "compaction_L0_L0", "compaction_LN", "manifest", "info_log", "other"}) {
    rules.push_back({{"rule", "create_channel"}, {"channel", o}, {"match", {{"origin", o}}}});
    rules.push_back(
        {{"rule", "create_object"}, {"channel", o}, {"object", "count"}, {"type", "noop"}});
  }
  rules.push_back({{"rule", "create_channel"}, {"channel", "rest"}, {"default", true}});
  rules.push_back(
      {{"rule", "create_object"}, {"channel", "rest"}, {"object", "count"}, {"type", "noop"}});
  return rules;
}

}  // namespace sluice::bench
