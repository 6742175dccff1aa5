// drft: fair transaction scheduling (DRFT): tenants get equal (weighted) use
// of the items their transactions contend on. An object that holds capacity
// whose units are admissions: a begin (Stage::acquire, op "begin";
// sluice/txn.h) takes one of `slots`, waiting its turn, and its Hold's
// release after TxnAccounting::on_end admits the next. The scheduling is
// DrftCore (sluice/objects/drft_core.h); docs/rules.md, "drft", has the
// configuration. Other requests pass; shutdown() cancels every waiter.
//
// Thread safety: every member is safe from any thread. State lives under one
// mutex held for bounded bookkeeping; a waiter sleeps on its own condition
// variable with it released. An admission at once takes the mutex once,
// allocates nothing and makes no system call. The object outlives every call
// (a Hold keeps it).
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
