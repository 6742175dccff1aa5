// drft: fair transaction scheduling (DRFT, dominant resource fair
// transactions): tenants get equal (weighted) use of the items their
// transactions contend on, whatever rate each sends. An object that holds
// capacity (EnforcementObject::holds_capacity) whose units are admissions: a
// transaction's begin acquires one (Stage::acquire with op "begin", the
// tenant, the transaction's id as workflow; sluice/txn.h), waiting while
// `slots` transactions run and others come first; its Hold's release (after
// TxnAccounting::on_end with what it used) frees the slot and admits the
// next. The scheduling itself, virtual times over dominant item usage with
// schedule-dependent usage charged retroactively, the memoryless start, the
// Δ bound and the throughput picker, is DrftCore (sluice/objects/drft_core.h),
// which says how each is computed.
//
// Configuration (JSON; configure() merges, fields absent keep their value):
//   "slots": transactions admitted at once, 1..65536 (default 64)
//   "delta_us": Δ, the spread of tenants' virtual times (µs of dominant item
//               usage per unit of weight) within which the throughput picker
//               chooses, 0..1e9 (default 0: memoryless DRFT)
//   "policy": "drft" (default) | "fifo" (order of arrival: the baseline)
//   "weights": {"<tenant>": w, ...}, merged; "weight_<tenant>": w;
//   "default_weight": w (default 1); 0.001 <= w <= 1e6
//   "max_tenants": 1..65536 (default 1024); tenants beyond share one, "other"
//   "sketch_width": a power of two, 64..1048576 (default 4096);
//   "sketch_depth": 1..8 (default 4): the count-min sketch of hot items
//   "hot_share": 0 < s <= 1 (default 0.01): an item is hot when it has at
//                least this share of the sketch's recent updates
// Tunables: "slots", "delta_us".
//
// A request routed here by enforce()/enforce_context() (an item access, a
// commit counted through the same channel) passes: only acquire() admits.
// shutdown() wakes every waiter (kCancelled); later acquires return
// kCancelled at once; releases and reports are still taken.
//
// Thread safety: every member is safe from any thread. The scheduling state
// lives under one mutex held for bounded bookkeeping (an admission, a
// release, a report: O(tenants with waiters) at most); a waiter sleeps on
// its own condition variable with the mutex released. A transaction that
// can be admitted at once (a slot free, nobody waiting) takes the mutex
// once, allocates nothing (records are made per slot when configured; a
// tenant's record on its first transaction) and makes no system call. The
// object must outlive every call on it (a Hold keeps it alive).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "sluice/enforcement_object.h"
#include "sluice/objects/drft_core.h"
#include "sluice/thread_annotations.h"
#include "sluice/txn.h"

namespace sluice {

inline constexpr std::uint32_t kDrftMaxSlots = 65536;
inline constexpr std::uint32_t kDrftMaxTenants = 65536;
inline constexpr double kDrftMaxDeltaUs = 1e9;
inline constexpr double kDrftMinWeight = 0.001;
inline constexpr double kDrftMaxWeight = 1e6;

// Parses a drft configuration onto `base` (the current one for a partial
// update, or the defaults at creation). Errors name the field:
// "slots: must be an integer from 1 to 65536, got 0".
StatusOr<drft::Settings> parse_drft_config(const nlohmann::json& config,
                                           const drft::Settings& base);

class Drft final : public EnforcementObject, public txn::TxnAccounting {
 public:
  // `clock` null: system_clock(). It stamps admissions and times waits.
  explicit Drft(Clock* clock);
  ~Drft() override;
  Drft(const Drft&) = delete;
  Drft& operator=(const Drft&) = delete;

  std::string_view type() const noexcept override { return "drft"; }
  Status validate(const nlohmann::json& config) const override SLUICE_EXCLUDES(mu_);
  Status configure(const nlohmann::json& config) override SLUICE_EXCLUDES(mu_);
  std::span<const std::string_view> tunables() const noexcept override;
  Status set_tunables(std::uint64_t mask,
                      std::span<const double, kMaxTunables> values) noexcept override
      SLUICE_EXCLUDES(mu_);

  bool holds_capacity() const noexcept override { return true; }
  // Admits the transaction ctx.workflow of tenant ctx.tenant, with the items
  // declared on this thread (txn::DeclaredItemsScope). `amount` is ignored:
  // one admission.
  Verdict acquire(const Context& ctx, std::uint64_t amount) noexcept override SLUICE_EXCLUDES(mu_);
  // Ends the transaction (as committed with no report, if on_end was not
  // called) and admits the next waiters.
  void release(const Context& ctx, std::uint64_t amount) noexcept override SLUICE_EXCLUDES(mu_);
  // One transaction: the same workflow and tenant.
  bool same_flow(const Context& a, const Context& b) const noexcept override {
    return a.workflow == b.workflow && a.tenant == b.tenant;
  }

  Result enforce(const Context& ctx, const Request& request) noexcept override;
  Verdict enforce_context(const Context&) noexcept override { return {}; }
  Verdict try_enforce_context(const Context&) noexcept override { return {}; }
  Verdict settle(const Context&, std::uint64_t) noexcept override { return {}; }

  // TxnAccounting.
  void on_lock_wait(const Context& txn, txn::ItemId item,
                    std::span<const std::uint32_t> blocker_tenants, std::int64_t wait_ns,
                    bool held_items) noexcept override SLUICE_EXCLUDES(mu_);
  void on_end(const Context& txn, const txn::TxnReport& report) noexcept override
      SLUICE_EXCLUDES(mu_);

  // {"policy", "slots", "delta_us", "running", "queued", "system_vt_us",
  //  "picks": {"fair", "throughput", "in_order"}, "sketch": {"bytes",
  //  "updates"}, "tenants": [{"tenant" (or "other"), "weight", "vt_us"
  //  (relative to the system's virtual time), "usage_us", "baseline_us",
  //  "sdu_charged_us", "sdu_passed_us", "admitted", "waits", "wait_us",
  //  "committed", "aborted", "conflicts", "lock_waits", "lock_wait_us",
  //  "running", "queued", "predicted_us"}]}. Counters are totals since
  // creation; tenants in the order first seen.
  nlohmann::json collect() const override SLUICE_EXCLUDES(mu_);
  void shutdown() noexcept override SLUICE_EXCLUDES(mu_);

 private:
  struct Sleeper;
  void dispatch_locked() SLUICE_REQUIRES(mu_);

  Clock* const clock_;
  mutable Mutex mu_;
  drft::Core core_ SLUICE_GUARDED_BY(mu_);
  bool shut_down_ SLUICE_GUARDED_BY(mu_) = false;
};

std::unique_ptr<EnforcementObject> make_drft(const ObjectEnv& env);

}  // namespace sluice
