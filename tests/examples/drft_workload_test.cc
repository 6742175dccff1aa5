// The drft example's workloads (examples/drft/workload.h): what a generated
// transaction accesses, the padding of an inflating tenant, key order, and the
// SmallBank mix.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "workload.h"

using sluice::examples::drft::Access;
using sluice::examples::drft::Workload;
using sluice::examples::drft::WorkloadSpec;

namespace {

bool in_key_order(const std::vector<Access>& t) {
  return std::is_sorted(t.begin(), t.end(),
                        [](const Access& a, const Access& b) { return a.key < b.key; });
}

bool distinct(const std::vector<Access>& t) {
  std::set<std::string> keys;
  for (const Access& a : t) keys.insert(a.key);
  return keys.size() == t.size();
}

int hot_count(const Workload& w, const WorkloadSpec& s, const std::vector<Access>& t) {
  int n = 0;
  for (const Access& a : t) {
    for (std::uint64_t k = 0; k < s.hot_keys; ++k) n += a.key == w.hot_key(k);
  }
  return n;
}

}  // namespace

TEST_CASE("drft example ycsb: K distinct records, the hot ones first and written") {
  WorkloadSpec s;
  s.keys = 1000;
  s.hot_keys = 4;
  s.items_per_txn = 4;
  s.hot_per_txn = 1;
  s.write_frac = 0.0;
  const Workload w(s);
  CHECK(w.all_keys().size() == 1000);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const std::vector<Access> t = w.next(rng, 0);
    REQUIRE(t.size() == 4);
    CHECK(distinct(t));
    CHECK(in_key_order(t));
    CHECK(hot_count(w, s, t) == 1);
    CHECK(t[0].write);  // the hot record sorts first and is read-modify-written
    // write_frac 0: the cold records are read only.
    CHECK(std::none_of(t.begin() + 1, t.end(), [](const Access& a) { return a.write; }));
  }
}

TEST_CASE("drft example: padding adds distinct hot keys, as many as the hot set has") {
  WorkloadSpec s;
  s.keys = 1000;
  s.hot_keys = 3;
  s.items_per_txn = 4;
  s.hot_per_txn = 1;
  const Workload w(s);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 500; ++i) {
    const std::vector<Access> one = w.next(rng, 1);
    REQUIRE(one.size() == 5);
    CHECK(hot_count(w, s, one) == 2);
    CHECK(distinct(one));
    CHECK(in_key_order(one));
    // Asking for more than the hot set holds gives the whole hot set, no duplicate.
    const std::vector<Access> all = w.next(rng, 8);
    CHECK(hot_count(w, s, all) == 3);
    CHECK(distinct(all));
  }
}

TEST_CASE("drft example smallbank: the mix, hot accounts and key order") {
  WorkloadSpec s;
  s.smallbank = true;
  s.keys = 1000;
  s.hot_keys = 4;
  s.hot_prob = 0.9;
  const Workload w(s);
  CHECK(w.all_keys().size() == 2000);  // a checking and a savings row per account
  std::mt19937_64 rng(11);
  // A transaction's shape names its type: (accesses, writes) and which rows.
  std::map<std::string, int> types;
  int with_hot = 0;
  const int n = 40'000;
  for (int i = 0; i < n; ++i) {
    const std::vector<Access> t = w.next(rng, 0);
    REQUIRE(!t.empty());
    CHECK(distinct(t));
    CHECK(in_key_order(t));
    int writes = 0, savings = 0;
    bool hot = false;
    for (const Access& a : t) {
      writes += a.write;
      savings += a.key[0] == 's';
      for (std::uint64_t k = 0; k < s.hot_keys; ++k) {
        hot |= a.key.substr(1) == Workload::checking(k).substr(1);
      }
    }
    with_hot += hot;
    std::string type;
    if (t.size() == 3)
      type = "amalgamate";
    else if (t.size() == 2 && writes == 0)
      type = "balance";
    else if (t.size() == 2 && writes == 2)
      type = "send-payment";
    else if (t.size() == 2 && writes == 1 && savings == 1)
      type = "write-check";
    else if (t.size() == 1 && savings == 0)
      type = "deposit-checking";
    else if (t.size() == 1 && savings == 1)
      type = "transact-savings";
    else
      type = "unknown";
    ++types[type];
  }
  const std::map<std::string, double> want = {{"amalgamate", 0.15},       {"balance", 0.15},
                                              {"deposit-checking", 0.15}, {"send-payment", 0.25},
                                              {"transact-savings", 0.15}, {"write-check", 0.15}};
  CHECK(types.count("unknown") == 0);
  for (const auto& [type, share] : want) {
    INFO(type);
    CHECK(types[type] / double(n) == Approx(share).margin(0.01));
  }
  // Almost every transaction touches a hot account (0.9 per account drawn).
  CHECK(with_hot / double(n) >= 0.88);
}
