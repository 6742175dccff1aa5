// Delta Fair Sharing's reservation arithmetic, as pure functions
// (docs/policies.md, "delta-fair", has the derivation). A write buffer
// (FairDB Equation 1):
//
//   f_i  = floor(C * w_i / W)                   fair share, W the sum of weights
//   D    = the sum of the k largest f_i         the worst case: k ramp-ups at once
//   s    = floor(R * δ / B)   ("strict")        whole segments flushable within δ
//        = round(R * δ / B)   ("nearest", halves up)
//   ρ    = min(D, ceil(max(0, D - s * B) / B) * B)
//   ρ_i  = round(f_i * ρ / D)                   what a ramp-up of tenant i counts on
//
// "strict" keeps δ a bound; "nearest" follows FairDB's published figures.
// Thread safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace sluice::delta_fair {

// How the number of whole segments flushable within δ is rounded.
enum class Rounding : std::uint8_t {
  kStrict,   // down: the bound δ always holds
  kNearest,  // to the nearest, halves up
};

std::string_view rounding_name(Rounding r) noexcept;

struct BufferModel {
  std::uint64_t capacity = 0;  // C, bytes; >= segment
  std::uint64_t segment = 0;   // B, bytes; >= 1
  double flush_bandwidth = 0;  // R_write, bytes per second; >= 0
  double delta_ms = 0;         // δ, >= 0; +infinity: no bound
  int k = 1;                   // ramp-up threshold, >= 1 (k >= n: every tenant)
  Rounding rounding = Rounding::kStrict;
};

struct Reservation {
  std::vector<std::uint64_t> fair_share;  // f_i, in the order of the weights
  std::uint64_t ramp_demand = 0;          // D
  // s, at most the segments D spans (ceil(D / B)); that many for δ = inf.
  std::uint64_t flushable_segments = 0;
  std::uint64_t reserved = 0;             // ρ
  double reserved_fraction = 0;           // ρ / C
  std::vector<std::uint64_t> per_tenant;  // ρ_i, in the order of the weights
  // Time to flush what a worst-case ramp-up needs beyond ρ, in whole
  // segments at R: ceil((D - ρ) / B) * B / R. +infinity when R = 0 and
  // something must flush.
  double flush_time_ms = 0;
  // The same with nothing reserved (instantaneous fair sharing):
  // ceil(D / B) * B / R.
  double worst_case_delay_ms = 0;
};

// The reservation for tenants of these weights (each in 0.001..1e6, at
// least one). Preconditions as BufferModel states them (checked in debug
// builds); the policy's configuration validates them.
Reservation reserve(const BufferModel& model, const std::vector<double>& weights);

struct CacheModel {
  std::uint64_t capacity = 0;     // C, bytes; >= 1
  double refill_bandwidth = 0;    // R_read, bytes per second; >= 0
  double read_amplification = 1;  // AMP, >= 1
  double delta_ms = 0;            // δ, >= 0; +infinity: no bound
  int k = 1;                      // ramp-up threshold, >= 1 (k >= n: every tenant)
};

struct CacheReservation {
  std::vector<std::uint64_t> fair_share;  // f_i, in the order of the weights
  std::vector<std::uint64_t> per_tenant;  // ρ_i, in the order of the weights
  std::uint64_t reserved = 0;             // the sum of the ρ_i
  double reserved_fraction = 0;           // that over C
  int ramp_ups = 1;                       // k' = min(k, n)
  // b = R_read * δ / (k' * AMP), bytes; +infinity for δ = inf.
  double refill_budget = 0;
  // The refill rate of one of k' ramp-ups, R_read / (k' * AMP), bytes/s.
  double refill_rate = 0;
  // The time a tenant with the largest fair share takes to refill all of it
  // at that rate: k' * max f_i * AMP / R_read, the delay without
  // reservations (δ = inf). +infinity when R_read = 0.
  double refill_time_ms = 0;
  // The same for what lies above the reservations, max (f_i - ρ_i): at
  // most δ (to within a byte's read). +infinity when R_read = 0 and
  // something is not reserved.
  double refill_time_reserved_ms = 0;
};

// Equation 2 for tenants of these weights (each in 0.001..1e6, at least
// one). Preconditions as CacheModel states them (checked in debug builds);
// the policy's configuration validates them.
CacheReservation reserve_cache(const CacheModel& model, const std::vector<double>& weights);

}  // namespace sluice::delta_fair
