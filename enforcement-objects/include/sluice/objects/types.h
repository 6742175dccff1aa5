// The enforcement objects' types that the bindings' public headers name:
// handles on objects a stage's rules created (TenantCache::find_reserve,
// DeferralActuator::find_gate) and the values they report. Objects are
// configured by rules (docs/rules.md), so their classes and configuration
// structs are not part of the installed API.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace sluice {

class CacheReserve;  // "cache-reserve"
class DeferralGate;  // "deferral-gate"

enum class DeferralState : std::uint8_t {
  kNormal = 0,
  kFirstStage = 1,
  kSecondStage = 2,
  kRecovering = 3,
};
// "normal", "first-stage", "second-stage", "recovering".
std::string_view deferral_state_name(DeferralState s) noexcept;
// A state from its name; nullopt for any other string.
std::optional<DeferralState> deferral_state_from_name(std::string_view name) noexcept;

// One owner's counters in one core (or summed over a cache's shards).
struct TenantLruStats {
  std::uint64_t usage = 0;    // bytes of its entries in the cache, pinned included
  std::uint64_t pinned = 0;   // of those, referenced (not evictable)
  std::uint64_t entries = 0;  // entries accounted
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t inserts = 0;
  std::uint64_t inserted_bytes = 0;  // the charges of those inserts
  std::uint64_t evictions = 0;
  // Evictions taken while the owner was at or below its threshold (and not
  // the inserting owner going above it). Stays 0 while anyone is above theirs.
  std::uint64_t evictions_below_reserved = 0;

  TenantLruStats& operator+=(const TenantLruStats& o) noexcept {
    usage += o.usage;
    pinned += o.pinned;
    entries += o.entries;
    hits += o.hits;
    misses += o.misses;
    inserts += o.inserts;
    inserted_bytes += o.inserted_bytes;
    evictions += o.evictions;
    evictions_below_reserved += o.evictions_below_reserved;
    return *this;
  }
};

}  // namespace sluice
