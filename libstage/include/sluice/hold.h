// Hold: capacity held in one enforcement object for one flow, from the
// acquire that took it (Stage::acquire, sluice/stage.h) until it is given
// back (EnforcementObject::holds_capacity and its acquire/release pair).
//
// A Hold is what a layer keeps between the two events that bound a use of
// capacity: bytes admitted into a tenant's memtable until that memtable is
// flushed, cached blocks until they are evicted. It remembers the object and
// the Context it was acquired with, and keeps the object alive (the stage's
// mechanism: the object with its counters), so that a release reaches the
// object that granted even after the rules changed, removed that object
// (which then no longer makes anyone wait, but still takes back what it
// lent), or the stage went away. Releasing gives units back to that object,
// which wakes the waiters it can now serve. The destructor releases what is
// still held.
//
// A Hold from an object that holds nothing (a token bucket, a queue: the
// request was enforced and let go) carries the verdict and holds nothing.
//
// Thread safety: a Hold is a value, like a std::unique_ptr: one thread uses
// it at a time, and it may be moved to another thread and released there
// (the object's release() is safe from any thread). Two Holds of one object
// may be used by two threads at once.
#pragma once

#include <cstdint>
#include <memory>

#include "sluice/context.h"
#include "sluice/enforcement_object.h"

namespace sluice {

class Hold {
 public:
  Hold() = default;  // holds nothing
  // What an acquire in `object` for `ctx` did: `amount` units held when
  // `verdict` is kOk (else nothing is held, and `amount` is ignored). For a
  // layer that acquires in an object itself; Stage::acquire makes these.
  Hold(std::shared_ptr<EnforcementObject> object, const Context& ctx, std::uint64_t amount,
       Verdict verdict) noexcept;
  // A Hold that holds nothing but carries `verdict`.
  explicit Hold(Verdict verdict) noexcept : verdict_(verdict) {}
  ~Hold() { release_all(); }

  Hold(Hold&& other) noexcept;
  // Releases what this one holds, then takes `other` over.
  Hold& operator=(Hold&& other) noexcept;
  Hold(const Hold&) = delete;
  Hold& operator=(const Hold&) = delete;

  Verdict verdict() const noexcept { return verdict_; }  // what the acquire did
  // Units held now (0 for a per-request object, and once all are released).
  std::uint64_t amount() const noexcept { return amount_; }
  bool holds() const noexcept { return amount_ > 0; }
  // The Context the units were acquired with (the flow they are charged to).
  const Context& context() const noexcept { return ctx_; }
  // The object the units are held in, while any are (else null): for a layer
  // that tells the granting object more than acquire and release carry (a
  // transaction binding reporting what a transaction used, sluice/txn.h).
  EnforcementObject* object() const noexcept { return object_.get(); }

  // Gives back min(n, amount()) units.
  void release(std::uint64_t n) noexcept;
  void release_all() noexcept { release(amount_); }
  // Adds `other`'s units to this hold when both are of the same object and
  // flow (EnforcementObject::same_flow), or this one holds nothing (it then
  // takes `other` over, verdict included); `other` is left holding nothing.
  // Returns false and changes nothing otherwise (and for `other` being this
  // hold). A hold that holds nothing is absorbed into any, adding nothing.
  bool absorb(Hold&& other) noexcept;
  // Whether this hold and `other` hold units of the same object and flow.
  bool same_place(const Hold& other) const noexcept;

 private:
  std::shared_ptr<EnforcementObject> object_;  // null when nothing is held
  Context ctx_{};
  std::uint64_t amount_ = 0;
  Verdict verdict_{};
};

}  // namespace sluice
