// The enforcement-object interface: one mechanism applied to the requests
// routed to it, configured from JSON validated into a typed struct, reporting
// its own state on collect (the stage counts requests, bytes and waits). A
// user's type registers itself by name (sluice/registry.h) like the built-in
// ones (sluice/objects/builtin.h). Thread safety, a contract every type keeps:
//  - enforce_context(), try_enforce_context() and settle() run concurrently
//    from any number of threads; settle() may wait as enforce_context() does,
//    try_enforce_context() never waits. validate() may run with anything.
//  - configure(), set_tunables() and collect() run concurrently with
//    enforce_context() and each other; an object synchronises its own state.
//  - acquire() is called as enforce_context() is; release() from any thread,
//    never waiting beyond a bounded critical section, also after shutdown().
//  - a waiting enforce_context() holds no lock configure(), collect() or
//    shutdown() need beyond a bounded section, and returns kCancelled once
//    shut down.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "sluice/board.h"
#include "sluice/clock.h"
#include "sluice/context.h"
#include "sluice/status.h"

namespace sluice {

enum class Outcome : std::uint8_t {
  kOk = 0,     // proceed with the request
  kCancelled,  // the object was removed or shut down while the request waited;
               // the layer proceeds unenforced (fail-open)
  kRejected,   // the object refuses the request (admission control); the layer
               // decides (the preload returns the original call's error)
  kWouldWait,  // the request must not wait (context_flag::kNoWait) and would
               // have: nothing was charged or counted; the layer does not make
               // the call (the preload fails it with EAGAIN)
};

// What enforcing one request did: two words, returned in registers.
struct Verdict {
  Outcome outcome = Outcome::kOk;
  std::uint64_t wait_ns = 0;  // time the request spent waiting in the object

  bool ok() const noexcept { return outcome == Outcome::kOk; }
};

// A grant an object offers the stage's per-thread shortcut (the stage's fast
// path): a plain function and its state, so that granting a request costs no
// virtual call and no Context.
struct FastGrant {
  // Grants a request of `size` bytes at once and returns true, doing exactly
  // what enforce_context() of such a request would do when it lets it go
  // without waiting (the object's own counters included); or returns false
  // having done nothing, and the stage then enforces the request with
  // enforce_context(), which may wait. Called by the thread that asked for
  // it (EnforcementObject::fast_grant), concurrently with everything
  // enforce_context() may run alongside. Must not wait, take a lock,
  // allocate, make a system call or change errno: it runs on the request's
  // way, inside an interposed call.
  bool (*grant)(void* state, std::uint64_t size) noexcept = nullptr;
  void* state = nullptr;  // the object, or the asking thread's part of it

  explicit operator bool() const noexcept { return grant != nullptr; }
};

struct ObjectEnv {
  Clock* clock = &system_clock();
};

class EnforcementObject {
 public:
  virtual ~EnforcementObject() = default;

  // The registered type name ("noop", "drl", ...).
  virtual std::string_view type() const noexcept = 0;

  // Checks `config` without applying it. Errors name the offending field
  // relative to the config object ("rate: must be a positive number").
  virtual Status validate(const nlohmann::json& config) const = 0;
  // Validates and applies `config` atomically: on error nothing changed.
  // Fields absent from `config` keep their current value.
  virtual Status configure(const nlohmann::json& config) = 0;

  // Tunables: the fields of this type's configuration that are plain numbers
  // a control loop retunes every cycle (a drl's "rate" and "burst"), by name,
  // at most kMaxTunables, always in the same order. A stage with a board
  // (sluice/board.h) gives an object that has some a slot there, through
  // which its control plane sets them without a message: the stage passes
  // the new values to set_tunables() on the next request routed to the
  // object (or the next collect), before enforcing it. Empty (the default):
  // none, and set_tunables() is never called.
  virtual std::span<const std::string_view> tunables() const noexcept { return {}; }
  // Applies new values to the tunables whose bit is set in `mask` (bit i:
  // values[i], for tunables()[i]) exactly as configure() with those fields
  // as JSON numbers would (the same checks, the same effect on waiting
  // requests), without building JSON: it runs on an application thread, on
  // its way to enforce a request. Atomic: on error nothing changed. Must
  // not wait beyond a bounded critical section.
  virtual Status set_tunables(std::uint64_t mask,
                              std::span<const double, kMaxTunables> values) noexcept;

  // Applies the mechanism to one request: the object's one entry, which
  // the stage calls for every request routed to it (the preload's, the
  // RocksDB binding's, an application's own). May wait; returns kCancelled
  // once shut down.
  virtual Verdict enforce_context(const Context& ctx) noexcept = 0;
  // enforce_context() for a request that must not wait
  // (context_flag::kNoWait): when the object can let it proceed at once,
  // does exactly what enforce_context() would; otherwise does nothing and
  // returns Outcome::kWouldWait. Never waits beyond a bounded critical
  // section. The default, for an object that cannot tell, says kWouldWait
  // unless the object passes everything through.
  virtual Verdict try_enforce_context(const Context& ctx) noexcept {
    (void)ctx;
    return passes_through() ? Verdict{} : Verdict{Outcome::kWouldWait, 0};
  }
  // A request this object enforced with `ctx` (ctx.size: what it was
  // charged, see pre_charge_of) moved `actual` bytes instead. When it moved
  // more, the object charges the excess as it would a request of that size,
  // waiting if it must, or, when ctx.flags has context_flag::kNoWait,
  // without waiting (a token bucket then owes it, and later requests wait
  // for it). When it moved less, the object may give the difference back.
  // Returns what charging the excess did (its wait, kCancelled after
  // shutdown()). The default gives nothing back and charges the excess with
  // enforce_context() of a request of the excess's size (under kNoWait:
  // try_enforce_context(), and nothing when that would wait); an object
  // whose charge does not depend on the size overrides it to do nothing.
  virtual Verdict settle(const Context& ctx, std::uint64_t actual) noexcept;

  // The object's grant for the stage's per-thread shortcut (FastGrant), or
  // none (the default): every request routed to the object then calls
  // enforce_context(). The stage uses it only where every request it covers
  // would reach this object with the same classifiers but the size, and only
  // for requests of at most kMaxPreCharge bytes, so the grant sees the size
  // alone: an object whose decision depends on anything else of the Context
  // offers none. A thread asks for it when it sets up its shortcut, and only
  // that thread calls what it got (so the state may be the thread's own: a
  // drl's lease slot), for as long as the object stays in the stage: the
  // function and state must stay valid for the object's life. An object that
  // cannot grant for a while (unconfigured, shut down, out of tokens) keeps
  // its grant and has it return false.
  virtual FastGrant fast_grant() noexcept { return {}; }

  // True for an object whose enforce_context() returns kOk at once for every
  // request without looking at it (noop). The stage then counts the requests
  // routed to it without calling it. Must not change over the object's life.
  virtual bool passes_through() const noexcept { return false; }

  // Objects that hold capacity. Token buckets, queues and gates act on one
  // request and let it go; a reservation pool grants capacity that the
  // caller holds between two events (bytes admitted into a memtable until
  // it is flushed) and gives back later, from any thread. The stage routes
  // an acquire like any request and counts it as one (Stage::acquire); the
  // caller's Hold (sluice/hold.h) keeps the object alive and releases to it.
  //
  // True for an object that holds capacity between acquire() and release()
  // (a reservation pool). Must not change over the object's life.
  virtual bool holds_capacity() const noexcept { return false; }
  // Takes `amount` units for ctx's flow, waiting while the object says so
  // (kCancelled after shutdown; kWouldWait without waiting when ctx.flags has
  // context_flag::kNoWait; kRejected if it refuses). Default: enforce_context()
  // of a request of `amount` bytes (try_enforce_context() under kNoWait): a
  // per-request object, which holds nothing.
  virtual Verdict acquire(const Context& ctx, std::uint64_t amount) noexcept;
  // Gives back `amount` units taken by acquire() for ctx's flow, from any thread.
  // Never waits beyond a bounded critical section; wakes waiters it can now serve.
  // Default: nothing.
  virtual void release(const Context& ctx, std::uint64_t amount) noexcept {
    (void)ctx;
    (void)amount;
  }
  // Whether units acquired with `a` and with `b` belong to the same flow of
  // this object, so that one release may give back units of both
  // (Hold::absorb). Default: the contexts' classifiers are all equal (the
  // workflow, tenant, origin, operation and level); an object that keys its
  // flows by one classifier compares that one.
  virtual bool same_flow(const Context& a, const Context& b) const noexcept {
    return a.workflow == b.workflow && a.tenant == b.tenant && a.origin == b.origin &&
           a.op == b.op && a.level == b.level;
  }

  // Object-specific state and counters (e.g. the current rate, tokens,
  // waiters) as a JSON object. Called by the stage on collect.
  virtual nlohmann::json collect() const;

  // The object is being removed: wake every waiter (they return kCancelled)
  // and make later enforce_context() calls return immediately.
  virtual void shutdown() noexcept {}
};

}  // namespace sluice
