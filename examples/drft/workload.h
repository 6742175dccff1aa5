// The drft example's two transactional workloads, as lists of key accesses a client runs
// in one transaction (examples/drft/drft_node.cc runs them on RocksDB):
//
//  - ycsb: records user00000000..; a transaction accesses `items_per_txn` distinct
//    records, `hot_per_txn` of them from the hot set (records 0..hot_keys-1, always
//    read-modify-written, first) and the rest uniformly from the others
//    (read-modify-written with probability `write_frac`, else read).
//  - smallbank: accounts with a checking (c...) and a savings (s...) row; an account is
//    a hot one (0..hot_keys-1) with probability `hot_prob`, else uniform over the rest;
//    the SmallBank mix (Amalgamate 15%, Balance 15%, DepositChecking 15%, SendPayment
//    25%, TransactSavings 15%, WriteCheck 15%).
//
// A tenant that inflates its demand adds `extra_items` read-modify-writes of hot keys
// not already in the transaction. Every transaction accesses its keys in key order (hot
// records sort before cold ones), so the generated transactions cannot deadlock.
//
// Thread safety: a Workload is immutable after construction; next() from any thread,
// each with its own generator.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace sluice::examples::drft {

struct Access {
  std::string key;
  bool write = false;  // read-modify-write (GetForUpdate then Put); else a plain Get
  bool operator==(const Access&) const = default;
};

struct WorkloadSpec {
  bool smallbank = false;
  std::uint64_t keys = 10'000;  // records (ycsb) or accounts (smallbank)
  std::uint64_t hot_keys = 4;
  int items_per_txn = 4;  // ycsb
  int hot_per_txn = 1;    // ycsb
  double write_frac = 0.2;
  double hot_prob = 0.9;  // smallbank
};

class Workload {
 public:
  explicit Workload(WorkloadSpec s) : s_(s) {}

  static std::string record(std::uint64_t i) { return key('u', i); }
  static std::string checking(std::uint64_t i) { return key('c', i); }
  static std::string savings(std::uint64_t i) { return key('s', i); }
  // The keys a load writes before the run.
  std::vector<std::string> all_keys() const {
    std::vector<std::string> out;
    for (std::uint64_t i = 0; i < s_.keys; ++i) {
      if (s_.smallbank) {
        out.push_back(checking(i));
        out.push_back(savings(i));
      } else {
        out.push_back(record(i));
      }
    }
    return out;
  }
  // A hot key (the k-th, modulo the hot set).
  std::string hot_key(std::uint64_t k) const {
    k %= std::max<std::uint64_t>(1, s_.hot_keys);
    return s_.smallbank ? checking(k) : record(k);
  }

  std::vector<Access> next(std::mt19937_64& rng, int extra_items) const {
    std::vector<Access> out = s_.smallbank ? smallbank(rng) : ycsb(rng);
    // Padding: hot keys the transaction does not need, in hot-set order after a random
    // start, as many as asked and as the hot set has.
    const std::uint64_t start = s_.hot_keys ? rng() % s_.hot_keys : 0;
    for (std::uint64_t k = 0; k < s_.hot_keys && extra_items > 0; ++k) {
      const std::string h = hot_key(start + k);
      if (std::none_of(out.begin(), out.end(), [&](const Access& a) { return a.key == h; })) {
        out.push_back({h, true});
        --extra_items;
      }
    }
    // Every access in key order (hot records sort before cold ones), padding included.
    std::sort(out.begin(), out.end(),
              [](const Access& x, const Access& y) { return x.key < y.key; });
    return out;
  }

 private:
  static std::string key(char prefix, std::uint64_t i) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "%c%08llu", prefix, static_cast<unsigned long long>(i));
    return buf;
  }
  std::uint64_t pick(std::mt19937_64& rng, std::uint64_t lo, std::uint64_t hi) const {
    return hi > lo ? lo + rng() % (hi - lo) : lo;
  }
  double uniform(std::mt19937_64& rng) const {
    return std::uniform_real_distribution<double>(0, 1)(rng);
  }

  std::vector<Access> ycsb(std::mt19937_64& rng) const {
    std::vector<std::uint64_t> hot, cold;
    const auto want_hot = static_cast<std::size_t>(std::min<std::uint64_t>(
        static_cast<std::uint64_t>(std::max(0, s_.hot_per_txn)), s_.hot_keys));
    while (hot.size() < want_hot) {
      const std::uint64_t k = pick(rng, 0, s_.hot_keys);
      if (std::find(hot.begin(), hot.end(), k) == hot.end()) hot.push_back(k);
    }
    const auto want_cold = static_cast<std::size_t>(std::max(0, s_.items_per_txn)) -
                           std::min(hot.size(), static_cast<std::size_t>(s_.items_per_txn));
    const std::uint64_t n_cold = s_.keys > s_.hot_keys ? s_.keys - s_.hot_keys : 0;
    while (cold.size() < std::min<std::uint64_t>(want_cold, n_cold)) {
      const std::uint64_t k = pick(rng, s_.hot_keys, s_.keys);
      if (std::find(cold.begin(), cold.end(), k) == cold.end()) cold.push_back(k);
    }
    std::sort(hot.begin(), hot.end());
    std::sort(cold.begin(), cold.end());
    std::vector<Access> out;
    for (std::uint64_t k : hot) out.push_back({record(k), true});
    for (std::uint64_t k : cold) out.push_back({record(k), uniform(rng) < s_.write_frac});
    return out;
  }

  std::uint64_t account(std::mt19937_64& rng) const {
    return uniform(rng) < s_.hot_prob ? pick(rng, 0, s_.hot_keys) : pick(rng, s_.hot_keys, s_.keys);
  }

  std::vector<Access> smallbank(std::mt19937_64& rng) const {
    const std::uint64_t a = account(rng);
    std::uint64_t b = account(rng);
    for (int tries = 0; b == a && tries < 8; ++tries) b = account(rng);
    if (b == a) b = (a + 1) % std::max<std::uint64_t>(1, s_.keys);
    const double u = uniform(rng);
    std::vector<Access> out;
    if (u < 0.15) {  // Amalgamate: a's savings and checking into b's checking
      out = {{savings(a), true}, {checking(a), true}, {checking(b), true}};
    } else if (u < 0.30) {  // Balance
      out = {{checking(a), false}, {savings(a), false}};
    } else if (u < 0.45) {  // DepositChecking
      out = {{checking(a), true}};
    } else if (u < 0.70) {  // SendPayment
      out = {{checking(a), true}, {checking(b), true}};
    } else if (u < 0.85) {  // TransactSavings
      out = {{savings(a), true}};
    } else {  // WriteCheck
      out = {{savings(a), false}, {checking(a), true}};
    }
    return out;
  }

  WorkloadSpec s_;
};

}  // namespace sluice::examples::drft
