// Hold: capacity held in one enforcement object for one flow, from
// Stage::acquire until it is given back. It keeps the granting object alive
// and remembers the Context, so a release reaches that object whatever the
// rules became (a removed object still takes back what it lent) and wakes
// the waiters it can now serve; the destructor releases what is still held.
// A Hold from an object that holds nothing carries only the verdict.
//
// Thread safety: a value, like a std::unique_ptr: one thread at a time, and
// it may be moved to and released on another thread. Two Holds of one object
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
