// A discrete-event simulation of transactions under two-phase locking,
// admitted by a DrftCore: tenants send transactions at fixed periods, each
// admitted transaction takes exclusive locks on its items in order (a FIFO
// queue per item), holds them until it commits, and is reported to the core
// as the RocksDB binding would report it (lock waits with their blockers'
// tenants, then its end with its first access and items). The ground truth
// it measures is each tenant's time holding one item, in a window.
//
// Single-threaded and deterministic: time is the simulation's own.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <tuple>
#include <vector>

#include "sluice/objects/drft_core.h"
#include "test_util.h"

namespace drft_sim {

using sluice::drft::ItemId;
using sluice::testing::kMs;
using sluice::testing::kUs;
constexpr std::int64_t kSec = sluice::testing::kSecond;

// One transaction's shape: before each access `think_ns`, after the last
// `work_ns`, then the commit.
struct Shape {
  std::vector<ItemId> items;
  std::int64_t think_ns = 50 * kUs;
  std::int64_t work_ns = 100 * kUs;
};

struct TenantLoad {
  std::uint32_t id = 0;
  std::int64_t period_ns = kMs;  // one transaction every period
  std::int64_t phase_ns = 0;
  std::int64_t start_ns = 0;
  std::int64_t stop_ns = std::numeric_limits<std::int64_t>::max();
  bool declare = false;  // declares its items at begin
  std::function<Shape(std::uint64_t n)> shape;
};

struct SimOutcome {
  std::map<std::uint32_t, double> usage_ns;        // time holding the measured item, in the window
  std::map<std::uint32_t, std::uint64_t> commits;  // commits in the window
  std::int64_t window_ns = 0;
  double max_vt_spread_ns = 0;  // largest spread of backlogged tenants' virtual times seen
};

inline double mmr(const std::map<std::uint32_t, double>& usage) {
  double lo = std::numeric_limits<double>::infinity();
  double hi = 0;
  for (const auto& [id, u] : usage) {
    lo = std::min(lo, u);
    hi = std::max(hi, u);
  }
  return hi > 0 ? lo / hi : 0;
}

class Sim {
 public:
  Sim(const sluice::drft::Settings& s, std::vector<TenantLoad> loads, ItemId measured,
      std::int64_t from_ns, std::int64_t to_ns)
      : loads_(std::move(loads)), measured_(measured), from_(from_ns), to_(to_ns) {
    core_.configure(s);
  }

  sluice::drft::Core& core() { return core_; }

  SimOutcome run() {
    for (std::size_t i = 0; i < loads_.size(); ++i) {
      const TenantLoad& l = loads_[i];
      push(std::max(l.start_ns, std::int64_t{0}) + l.phase_ns, kArrive, i);
      out_.usage_ns[l.id] = 0;
      out_.commits[l.id] = 0;
    }
    while (!events_.empty()) {
      auto [t, seq, kind, who] = events_.top();
      events_.pop();
      if (t > to_) break;
      now_ = t;
      switch (kind) {
        case kArrive:
          arrive(who);
          break;
        case kAccess:
          access(txns_[who]);
          break;
        case kCommit:
          commit(txns_[who]);
          break;
      }
      track_spread();
    }
    out_.window_ns = to_ - from_;
    return out_;
  }

 private:
  enum Kind { kArrive, kAccess, kCommit };
  struct Txn {
    std::size_t index = 0;
    std::size_t load = 0;
    std::uint64_t id = 0;
    Shape shape;
    std::size_t next = 0;
    std::vector<ItemId> held;
    std::int64_t first_access = 0;
    std::int64_t wait_start = 0;
    std::int64_t measured_since = -1;
    sluice::drft::Txn* core_txn = nullptr;
  };
  struct Lock {
    Txn* holder = nullptr;
    std::deque<Txn*> queue;
  };

  void push(std::int64_t t, Kind k, std::size_t who) { events_.emplace(t, seq_++, k, who); }

  void arrive(std::size_t li) {
    const TenantLoad& l = loads_[li];
    const std::uint64_t n = sent_[li]++;
    if (now_ + l.period_ns < l.stop_ns) push(now_ + l.period_ns, kArrive, li);
    txns_.emplace_back();
    Txn& x = txns_.back();
    x.index = txns_.size() - 1;
    x.load = li;
    x.id = next_id_++;
    x.shape = l.shape(n);
    std::vector<ItemId> declared = l.declare ? x.shape.items : std::vector<ItemId>{};
    sluice::drft::Tenant& t = core_.tenant(l.id);
    if (core_.admits_now()) {
      x.core_txn = core_.admit_now(t, x.id, declared, now_);
      begin(x);
      return;
    }
    waiters_.emplace_back();
    sluice::drft::Waiter& w = waiters_.back();
    w.tenant = &t;
    w.txn_id = x.id;
    w.arrived_ns = now_;
    for (ItemId item : declared) {
      if (w.n_items < sluice::drft::kMaxItems) w.items[w.n_items++] = item;
    }
    waiting_txn_[&w] = x.index;
    core_.enqueue(w);
  }

  void begin(Txn& x) {
    if (x.shape.items.empty()) {
      push(now_ + x.shape.work_ns, kCommit, x.index);
    } else {
      push(now_ + x.shape.think_ns, kAccess, x.index);
    }
  }

  void granted(Txn& x, ItemId item) {
    x.held.push_back(item);
    if (x.first_access == 0) x.first_access = now_;
    if (item == measured_) x.measured_since = now_;
    ++x.next;
    if (x.next < x.shape.items.size()) {
      push(now_ + x.shape.think_ns, kAccess, x.index);
    } else {
      push(now_ + x.shape.work_ns, kCommit, x.index);
    }
  }

  void access(Txn& x) {
    const ItemId item = x.shape.items[x.next];
    Lock& l = locks_[item];
    if (l.holder == nullptr) {
      l.holder = &x;
      granted(x, item);
      return;
    }
    x.wait_start = now_;
    l.queue.push_back(&x);
  }

  void commit(Txn& x) {
    const std::uint32_t tenant = loads_[x.load].id;
    if (x.measured_since >= 0) {
      const std::int64_t a = std::max(x.measured_since, from_);
      const std::int64_t b = std::min(now_, to_);
      if (b > a) out_.usage_ns[tenant] += static_cast<double>(b - a);
    }
    if (now_ >= from_) ++out_.commits[tenant];
    sluice::txn::TxnReport r;
    r.end = sluice::txn::TxnEnd::kCommitted;
    r.first_access_ns = x.first_access;
    r.end_ns = now_;
    r.items = std::span<const ItemId>(x.shape.items.data(),
                                      std::min(x.shape.items.size(), sluice::drft::kMaxItems));
    core_.end(*x.core_txn, r);
    // Locks pass to the next waiter, which reports its wait.
    for (ItemId item : x.held) {
      Lock& l = locks_[item];
      l.holder = nullptr;
      if (l.queue.empty()) continue;
      Txn* w = l.queue.front();
      l.queue.pop_front();
      l.holder = w;
      const std::uint32_t blocker = tenant;
      core_.lock_wait(w->core_txn, loads_[w->load].id, item,
                      std::span<const std::uint32_t>(&blocker, 1),
                      static_cast<double>(now_ - w->wait_start), !w->held.empty());
      granted(*w, item);
    }
    while (sluice::drft::Waiter* w = core_.dispatch_one(now_)) {
      Txn& y = txns_[waiting_txn_.at(w)];
      waiting_txn_.erase(w);
      y.core_txn = w->txn;
      begin(y);
    }
  }

  void track_spread() {
    if (now_ < from_) return;
    double lo = std::numeric_limits<double>::infinity();
    double hi = -lo;
    for (const auto& t : core_.tenants()) {
      if (t->running + t->queued == 0) continue;
      lo = std::min(lo, t->vt);
      hi = std::max(hi, t->vt);
    }
    if (hi > lo) out_.max_vt_spread_ns = std::max(out_.max_vt_spread_ns, hi - lo);
  }

  sluice::drft::Core core_;
  std::vector<TenantLoad> loads_;
  ItemId measured_;
  std::int64_t from_, to_;
  std::int64_t now_ = 0;
  std::uint64_t seq_ = 0;
  std::uint64_t next_id_ = 1;
  std::priority_queue<std::tuple<std::int64_t, std::uint64_t, Kind, std::size_t>,
                      std::vector<std::tuple<std::int64_t, std::uint64_t, Kind, std::size_t>>,
                      std::greater<>>
      events_;
  std::deque<Txn> txns_;
  std::deque<sluice::drft::Waiter> waiters_;
  std::map<sluice::drft::Waiter*, std::size_t> waiting_txn_;
  std::map<ItemId, Lock> locks_;
  std::map<std::size_t, std::uint64_t> sent_;
  SimOutcome out_;
};

}  // namespace drft_sim
