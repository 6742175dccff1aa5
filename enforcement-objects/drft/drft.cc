// The drft object (sluice/objects/drft.h): DrftCore under a mutex, with
// waiters that sleep on their own condition variables.
#include "sluice/objects/drft.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace sluice {
namespace {

constexpr std::string_view kDrftTunables[] = {"slots", "delta_us"};

double us(double ns) {
  return std::round(ns) / 1e3;
}

}  // namespace

struct Drft::Sleeper : drft::Waiter {
  std::condition_variable cv;
  bool granted = false;
  bool cancelled = false;
};

Drft::Drft(Clock* clock) : clock_(clock != nullptr ? clock : &system_clock()) {}

Drft::~Drft() = default;

Status Drft::validate(const nlohmann::json& config) const {
  drft::Settings base;
  {
    MutexLock lock(mu_);
    base = core_.settings();
  }
  return parse_drft_config(config, base).status();
}

Status Drft::configure(const nlohmann::json& config) {
  MutexLock lock(mu_);
  auto s = parse_drft_config(config, core_.settings());
  if (!s.is_ok()) return s.status();
  core_.configure(s.value());
  dispatch_locked();  // more slots may admit waiters now
  return {};
}

std::span<const std::string_view> Drft::tunables() const noexcept {
  return kDrftTunables;
}

Status Drft::set_tunables(std::uint64_t mask,
                          std::span<const double, kMaxTunables> values) noexcept {
  if (mask >> std::size(kDrftTunables))
    return Status::invalid("drft has tunables slots and delta_us only");
  MutexLock lock(mu_);
  drft::Settings s = core_.settings();
  if ((mask & 1) != 0) {
    const double v = values[0];
    if (!std::isfinite(v) || v != std::floor(v) || v < 1 || v > kDrftMaxSlots) {
      return Status::invalid("slots: must be an integer from 1 to 65536, got " + std::to_string(v));
    }
    s.slots = static_cast<std::uint32_t>(v);
  }
  if ((mask & 2) != 0) {
    const double v = values[1];
    if (!std::isfinite(v) || v < 0 || v > kDrftMaxDeltaUs) {
      return Status::invalid("delta_us: must be a number of microseconds from 0 to 1e9, got " +
                             std::to_string(v));
    }
    s.delta_ns = v * 1e3;
  }
  core_.configure(s);
  dispatch_locked();
  return {};
}

Verdict Drft::acquire(const Context& ctx, std::uint64_t /*amount*/) noexcept {
  const std::span<const txn::ItemId> declared = txn::declared_items();
  MutexLock lock(mu_);
  if (shut_down_) return {Outcome::kCancelled, 0};
  drft::Tenant& t = core_.tenant(ctx.tenant);
  const std::int64_t now = clock_->now_ns();
  if (core_.admits_now()) {
    core_.admit_now(t, ctx.workflow, declared, now);
    return {};
  }
  if ((ctx.flags & context_flag::kNoWait) != 0) return {Outcome::kWouldWait, 0};
  Sleeper self;
  self.tenant = &t;
  self.txn_id = ctx.workflow;
  self.arrived_ns = now;
  for (txn::ItemId item : declared.first(std::min(declared.size(), drft::kMaxItems))) {
    self.items[self.n_items++] = item;
  }
  core_.enqueue(self);
  dispatch_locked();  // a slot may be free (a waiter came first but not a slot's worth)
  while (!self.granted && !self.cancelled) clock_->wait(lock.native(), self.cv);
  const std::int64_t waited = std::max<std::int64_t>(0, clock_->now_ns() - now);
  return {self.granted ? Outcome::kOk : Outcome::kCancelled, static_cast<std::uint64_t>(waited)};
}

void Drft::dispatch_locked() {
  if (core_.queued() == 0) return;
  const std::int64_t now = clock_->now_ns();
  while (drft::Waiter* w = core_.dispatch_one(now)) {
    auto* s = static_cast<Sleeper*>(w);
    s->granted = true;
    s->cv.notify_one();
  }
}

void Drft::release(const Context& ctx, std::uint64_t /*amount*/) noexcept {
  MutexLock lock(mu_);
  if (drft::Txn* x = core_.find(ctx.workflow); x != nullptr) {
    txn::TxnReport r;
    r.end_ns = clock_->now_ns();
    core_.end(*x, r);
  }
  dispatch_locked();
}

void Drft::on_lock_wait(const Context& txn, txn::ItemId item,
                        std::span<const std::uint32_t> blocker_tenants, std::int64_t wait_ns,
                        bool held_items) noexcept {
  MutexLock lock(mu_);
  core_.lock_wait(core_.find(txn.workflow), txn.tenant, item, blocker_tenants,
                  static_cast<double>(wait_ns), held_items);
}

void Drft::on_end(const Context& txn, const txn::TxnReport& report) noexcept {
  MutexLock lock(mu_);
  drft::Txn* x = core_.find(txn.workflow);
  if (x == nullptr) {
    ++core_.unknown_ends;
    return;
  }
  txn::TxnReport r = report;
  if (r.end_ns == 0) r.end_ns = clock_->now_ns();
  core_.end(*x, r);
  dispatch_locked();
}

nlohmann::json Drft::collect() const {
  MutexLock lock(mu_);
  const drft::Settings& s = core_.settings();
  const double vsys = core_.system_vt();
  nlohmann::json tenants = nlohmann::json::array();
  for (const auto& t : core_.tenants()) {
    nlohmann::json j = {{"tenant", t->other ? nlohmann::json("other") : nlohmann::json(t->id)},
                        {"weight", t->weight},
                        {"vt_us", us(t->vt - vsys)},
                        {"usage_us", us(t->usage_ns)},
                        {"baseline_us", us(t->baseline_ns)},
                        {"sdu_charged_us", us(t->sdu_charged_ns)},
                        {"sdu_passed_us", us(t->sdu_credited_ns)},
                        {"admitted", t->admitted},
                        {"waits", t->waits},
                        {"wait_us", us(t->wait_ns)},
                        {"committed", t->committed},
                        {"aborted", t->aborted},
                        {"conflicts", t->conflicts},
                        {"lock_waits", t->lock_waits},
                        {"lock_wait_us", us(t->lock_wait_ns)},
                        {"running", t->running},
                        {"queued", t->queued},
                        {"predicted_us", us(t->est_ns)}};
    tenants.push_back(std::move(j));
  }
  return {{"policy", s.fifo ? "fifo" : "drft"},
          {"slots", s.slots},
          {"delta_us", s.delta_ns / 1e3},
          {"running", core_.running()},
          {"queued", core_.queued()},
          {"system_vt_us", us(vsys)},
          {"picks",
           {{"fair", core_.picks_fair},
            {"throughput", core_.picks_throughput},
            {"in_order", core_.picks_in_order}}},
          {"unknown_reports", core_.unknown_ends},
          {"sketch", {{"bytes", core_.sketch().bytes()}, {"updates", core_.sketch().total()}}},
          {"tenants", std::move(tenants)}};
}

void Drft::shutdown() noexcept {
  MutexLock lock(mu_);
  shut_down_ = true;
  for (drft::Waiter* w : core_.drain()) {
    auto* s = static_cast<Sleeper*>(w);
    s->cancelled = true;
    s->cv.notify_one();
  }
}

std::unique_ptr<EnforcementObject> make_drft(const ObjectEnv& env) {
  return std::make_unique<Drft>(env.clock);
}

}  // namespace sluice
