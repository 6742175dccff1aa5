// DrftCore: the scheduling state and decisions of the "drft" object, with no
// lock, thread or clock of its own, so that a test drives it step by step. A
// tenant's virtual time is its transactions' dominant item usage over its
// weight (ns): a prediction charged at admission, corrected at the end, and
// lock waits charged at once to the blockers' tenants. Starts are
// memoryless. Beyond a spread of delta the least virtual time is admitted,
// within it the waiter that conflicts least with the running transactions;
// hot items come from a count-min sketch. docs/rules.md, "drft", has each.
//
// Thread safety: none; the owner serialises every call. A Waiter lives on its
// thread's stack until dispatched or removed; a Txn pointer is valid until
// end().
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "sluice/txn.h"

namespace sluice::drft {

using txn::ItemId;
inline constexpr std::size_t kMaxItems = txn::kMaxReportedItems;

struct Settings {
  std::uint32_t slots = 64;  // transactions admitted at once
  double delta_ns = 0;       // Δ: bound on the spread of virtual times
  bool fifo = false;         // admit in order of arrival (the baseline)
  double default_weight = 1;
  std::map<std::uint32_t, double> weights;  // tenant -> weight
  std::uint32_t max_tenants = 1024;         // tenants beyond share one, "other"
  std::uint32_t sketch_width = 4096;        // a power of two
  std::uint32_t sketch_depth = 4;
  double hot_share = 0.01;
};

// ItemId -> count, open addressing with backward-shift deletion, fixed
// capacity (a power of two, at least twice the most entries it holds).
class ItemCounts {
 public:
  void reset(std::size_t capacity);
  void add(ItemId item, std::uint32_t n);
  void remove(ItemId item, std::uint32_t n);  // erases at 0
  std::uint32_t get(ItemId item) const noexcept;
  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept { return slots_.size(); }

 private:
  struct Slot {
    ItemId item = 0;  // 0: empty (item_of never gives 0)
    std::uint32_t count = 0;
  };
  std::size_t home(ItemId item) const noexcept {
    return static_cast<std::size_t>((item * 0x9E3779B97F4A7C15ULL) >> shift_);
  }
  std::vector<Slot> slots_;
  unsigned shift_ = 64;
  std::size_t size_ = 0;
};

// Count-min sketch of item updates, halved every `window` updates.
class CountMin {
 public:
  void reset(std::uint32_t width, std::uint32_t depth);
  void add(ItemId item, std::uint32_t n) noexcept;
  std::uint32_t estimate(ItemId item) const noexcept;
  std::uint64_t total() const noexcept { return total_; }  // updates since the last halving, halved
  std::size_t bytes() const noexcept { return counters_.size() * sizeof(std::uint32_t); }

 private:
  std::size_t index(unsigned row, ItemId item) const noexcept;
  std::vector<std::uint32_t> counters_;
  std::uint32_t width_ = 0, depth_ = 0;
  std::uint64_t total_ = 0, window_ = 0;
};

struct Waiter;
struct Txn;

struct Tenant {
  std::uint32_t id = 0;
  bool other = false;  // the shared tenant of ids beyond max_tenants
  double weight = 1;
  double vt = 0;      // virtual time, ns of dominant usage / weight
  double est_ns = 0;  // predicted usage of its next transaction
  std::uint32_t running = 0;
  std::uint32_t queued = 0;
  Waiter* head = nullptr;
  Waiter* tail = nullptr;
  std::int32_t active_at = -1;   // index in Core::active_, -1 if idle
  std::int32_t waiting_at = -1;  // index in Core::waiting_, -1 if none waits
  ItemId predicted[kMaxItems] = {};
  std::uint8_t n_predicted = 0;
  // Counters since creation.
  std::uint64_t admitted = 0, waits = 0, committed = 0, aborted = 0, conflicts = 0;
  std::uint64_t lock_waits = 0;
  double wait_ns = 0, lock_wait_ns = 0;
  double usage_ns = 0;         // dominant usage charged (baseline kept + SDU charged)
  double baseline_ns = 0;      // baseline usage of its transactions
  double sdu_charged_ns = 0;   // schedule-dependent usage charged as a blocker
  double sdu_credited_ns = 0;  // ... passed on to blockers as a waiter
};

struct Waiter {
  Tenant* tenant = nullptr;
  std::uint64_t txn_id = 0;
  std::uint64_t seq = 0;
  std::int64_t arrived_ns = 0;
  ItemId items[kMaxItems] = {};
  std::uint8_t n_items = 0;
  Waiter* next = nullptr;
  Txn* txn = nullptr;  // set when dispatched
};

struct Txn {
  std::uint64_t id = 0;
  Tenant* tenant = nullptr;
  std::int64_t admitted_ns = 0;
  double charged_ns = 0;         // the prediction charged at admission
  double credit_ns = 0;          // schedule-dependent usage passed on to blockers
  ItemId items[kMaxItems] = {};  // in the running map
  std::uint8_t n_items = 0;
};

class Core {
 public:
  Core();
  // Applies `s` (checked by the caller). Allocates (tables sized by slots).
  void configure(const Settings& s);
  const Settings& settings() const noexcept { return s_; }

  // The tenant of `id` (made on first sight; "other" beyond max_tenants).
  Tenant& tenant(std::uint32_t id);
  // Whether a transaction arriving now is admitted at once.
  bool admits_now() const noexcept { return running_ < s_.slots && queued_ == 0; }
  // Admits a transaction of `t` that arrived now; requires admits_now().
  Txn* admit_now(Tenant& t, std::uint64_t txn_id, std::span<const ItemId> declared,
                 std::int64_t now_ns);
  // Queues `w` (tenant, txn_id, items and arrived_ns set).
  void enqueue(Waiter& w);
  // Takes the waiter admitted next when a slot is free: unlinks it, admits
  // its transaction (w->txn) and returns it; null when none.
  Waiter* dispatch_one(std::int64_t now_ns);
  // Unlinks a waiter that gives up (shutdown).
  void remove(Waiter& w);
  // Every waiter, for shutdown: unlinks and returns them.
  std::vector<Waiter*> drain();

  Txn* find(std::uint64_t txn_id) noexcept;
  void lock_wait(Txn* waiter, std::uint32_t waiter_tenant, ItemId item,
                 std::span<const std::uint32_t> blocker_tenants, double wait_ns, bool held_items);
  // Ends `x`: charges its usage, frees its slot (x is invalid after).
  void end(Txn& x, const txn::TxnReport& r);

  std::uint32_t running() const noexcept { return running_; }
  std::uint32_t queued() const noexcept { return queued_; }
  double system_vt() const noexcept { return vsys_; }
  const std::vector<std::unique_ptr<Tenant>>& tenants() const noexcept { return tenants_; }
  bool hot(ItemId item) const noexcept;
  const CountMin& sketch() const noexcept { return sketch_; }
  // Decisions since creation.
  std::uint64_t picks_fair = 0;        // the least virtual time, spread beyond delta (or delta 0)
  std::uint64_t picks_throughput = 0;  // the picker chose another than the least virtual time
  std::uint64_t picks_in_order = 0;    // fifo
  std::uint64_t unknown_ends = 0;      // end or lock wait of a transaction not running

 private:
  void arrive(Tenant& t);
  Txn* start(Tenant& t, std::uint64_t txn_id, std::span<const ItemId> items, std::int64_t now_ns);
  Waiter* pick();
  std::uint32_t conflicts(const Waiter& w) const noexcept;
  void leave_if_idle(Tenant& t);
  void unlink_waiting(Tenant& t);
  // Debug builds: the counts and lists agree with the tenants, and `touched`'s queue
  // with its count.
  void check_invariants(const Tenant& touched) const;
  void index_put(Txn* x);
  void index_erase(const Txn* x);
  void grow_index();

  Settings s_;
  std::vector<std::unique_ptr<Tenant>> tenants_;
  std::unordered_map<std::uint32_t, Tenant*> by_id_;
  Tenant* other_ = nullptr;
  std::vector<Tenant*> active_;   // running or queued
  std::vector<Tenant*> waiting_;  // queued
  std::uint32_t running_ = 0, queued_ = 0;
  std::uint64_t next_seq_ = 0;
  double vsys_ = 0;  // system virtual time: monotone, the start of the latest admission
  // Transactions: a pool (free list) and an index by id (open addressing).
  std::vector<std::unique_ptr<Txn>> txn_pool_;
  std::vector<Txn*> free_txns_;
  std::vector<Txn*> index_;  // null: empty
  std::size_t index_size_ = 0;
  ItemCounts running_items_;  // items of running transactions, counted
  CountMin sketch_;
};

}  // namespace sluice::drft
