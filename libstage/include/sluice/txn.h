// Transactions for stages: the vocabulary a key-value layer
// (sluice/rocksdb_txn.h) and a transaction scheduler ("drft") share. A
// transaction is a workflow: its begin is Stage::acquire of one unit with
// {op: begin, tenant, workflow: its id}, its Hold keeps the admission until
// it ends, its accesses are get/put/delete/merge requests, its end a commit or
// abort request. Items, lock waits and outcome go through TxnAccounting
// (accounting_of(hold)); items are 64-bit key hashes (item_of), optionally
// declared before the begin (DeclaredItemsScope).
//
// Thread safety: item_of and accounting_of are pure; DeclaredItemsScope is
// per thread; TxnAccounting implementations are safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "sluice/context.h"
#include "sluice/hold.h"

namespace sluice::txn {

using ItemId = std::uint64_t;

// The item of a key (with its column family): a 64-bit mix of the bytes.
// Never 0 (0 means "no item").
inline ItemId item_of(std::string_view key, std::uint32_t column_family = 0) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL ^ (std::uint64_t{column_family} * 0x9E3779B97F4A7C15ULL);
  for (unsigned char c : key) h = (h ^ c) * 0x100000001b3ULL;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h == 0 ? 1 : h;
}

// How a transaction ended.
enum class TxnEnd : std::uint8_t {
  kCommitted = 0,
  kAborted,   // rolled back by the application, or failed for another reason
  kConflict,  // refused at commit for a conflict (an optimistic transaction's Busy)
};

// What a transaction did, reported once when it ends.
struct TxnReport {
  TxnEnd end = TxnEnd::kCommitted;
  // When its first item access completed (an item is held from then on; 0:
  // none recorded), and when it ended, on the object's clock.
  std::int64_t first_access_ns = 0;
  std::int64_t end_ns = 0;
  // Up to kMaxReportedItems distinct items it accessed, in order of first
  // access.
  std::span<const ItemId> items;
};
inline constexpr std::size_t kMaxReportedItems = 8;

// Implemented by an object that schedules transactions, next to its
// acquire/release. The layer calls, for a transaction begun with a Hold from
// that object:
//  - on_lock_wait() each time the transaction waited for a lock, after the
//    wait, with the item and the tenants of the transactions that held it;
//  - on_end() once, before it releases the Hold.
class TxnAccounting {
 public:
  virtual ~TxnAccounting() = default;
  // `txn`: the Context of the begin (the Hold's). `held_items`: whether the
  // waiter held any item during the wait (its wait then kept those items
  // from others: schedule-dependent usage, which the blockers share).
  virtual void on_lock_wait(const Context& txn, ItemId item,
                            std::span<const std::uint32_t> blocker_tenants, std::int64_t wait_ns,
                            bool held_items) noexcept = 0;
  virtual void on_end(const Context& txn, const TxnReport& report) noexcept = 0;
};

// The accounting of the object `hold` holds a begin in, or null (a hold that
// holds nothing, an object that does not schedule transactions).
inline TxnAccounting* accounting_of(const Hold& hold) noexcept {
  return dynamic_cast<TxnAccounting*>(hold.object());
}

namespace detail {
inline thread_local std::span<const ItemId> t_declared_items;
}  // namespace detail

// The items declared for the begin this thread is about to acquire (empty
// outside any scope).
inline std::span<const ItemId> declared_items() noexcept {
  return detail::t_declared_items;
}

// Declares `items` (at most kMaxReportedItems are read) for the acquires made
// on this thread while the scope is open. `items` must outlive the scope.
class DeclaredItemsScope {
 public:
  explicit DeclaredItemsScope(std::span<const ItemId> items) noexcept
      : saved_(detail::t_declared_items) {
    detail::t_declared_items = items;
  }
  ~DeclaredItemsScope() { detail::t_declared_items = saved_; }
  DeclaredItemsScope(const DeclaredItemsScope&) = delete;
  DeclaredItemsScope& operator=(const DeclaredItemsScope&) = delete;

 private:
  std::span<const ItemId> saved_;
};

}  // namespace sluice::txn
