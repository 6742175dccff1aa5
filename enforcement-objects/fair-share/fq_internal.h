// The fq object's parts that its two source files share: work units, request
// classes, and the structures behind Fq's private declarations (a flow, its
// stripes, a waiter, the flow table). Not installed; only fq.cc and
// fq_queue.cc include it.
//
// Thread safety: as sluice/objects/fq.h says. Fields marked "under mu_" are
// read and written with the object's mutex held; the atomics are what the
// lock-free path touches.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>

#include "flow_table.h"
#include "sluice/objects/fq.h"

namespace sluice {
namespace fq_detail {

// A work unit is 2^-10 ns of the server's time.
inline constexpr int kWorkShift = 10;
inline constexpr std::int64_t kWorkPerNs = std::int64_t{1} << kWorkShift;
inline constexpr double kWorkPerSecond = 1e9 * static_cast<double>(kWorkPerNs);
// The largest cost (about 13 days of work), and the deepest credit.
inline constexpr std::int64_t kMaxCost = std::int64_t{1} << 60;
inline constexpr double kMaxCostD = 1152921504606846976.0;  // 2^60
// Tags are moved back by V when it reaches this (ns per unit of weight), so
// that a double keeps sub-nanosecond resolution.
inline constexpr double kRebaseAt = 1099511627776.0;  // 2^40
inline constexpr double kNoTag = -std::numeric_limits<double>::infinity();

// Request classes, indexing Fq::coef_ and a flow's byte counters.
inline constexpr unsigned kRead = 0;
inline constexpr unsigned kWrite = 1;
inline constexpr unsigned kOtherOp = 2;

}  // namespace fq_detail

// A flow's lease and counters for the threads whose stripe it is, on a line
// of their own.
struct alignas(64) Fq::Stripe {
  // The lock-free path's: the lease word, and the bytes served (read, write).
  std::atomic<std::uint64_t> lease{0};
  std::array<std::atomic<std::uint64_t>, 2> bytes{};
  // Under mu_.
  Flow* flow = nullptr;
  std::uint64_t seen = 0;  // the lease's balance as last seen
  bool leased = false;     // in leased_
};

struct Fq::Flow {
  Flow(std::uint64_t i, std::uint32_t n, bool o, double w) : id(i), index(n), other(o), weight(w) {
    for (Stripe& s : stripes) s.flow = this;
  }

  std::array<Stripe, kStripes> stripes;

  // The rest under mu_, on its own line.
  alignas(64) const std::uint64_t id;
  const std::uint32_t index;  // in flows_: ties between equal tags go to the older flow
  const bool other;           // the flow of every id beyond max_flows
  std::ptrdiff_t heap_pos = -1;
  double weight;
  double finish = fq_detail::kNoTag;  // F
  Waiter* head = nullptr;             // its waiters, in order of arrival
  Waiter* tail = nullptr;
  std::uint64_t queued = 0;
  std::uint64_t served_ops = 0;
  std::int64_t served_work = 0;
  std::int64_t arrived_work = 0;
  std::int64_t waited_ns = 0;      // of the waits that ended
  std::int64_t arrivals_ns = 0;    // the sum of its waiters' arrival times
  std::int64_t backlogged_ns = 0;  // of the backlogs that ended
  std::int64_t backlog_since = 0;
};

struct Fq::Waiter {
  Waiter(Flow& f, std::int64_t c, double s, unsigned k, std::uint64_t b, bool counts,
         std::int64_t now)
      : flow(f), cost(c), start(s), op_class(k), bytes(b), counts_op(counts), arrived_ns(now) {}
  Flow& flow;
  std::int64_t cost;  // work units
  double start;       // S
  const unsigned op_class;
  const std::uint64_t bytes;
  const bool counts_op;  // a request (not a settlement's extra work)
  const std::int64_t arrived_ns;
  std::condition_variable cv;
  Waiter* next = nullptr;
  bool granted = false;
  bool cancelled = false;
};

// Flow id -> Flow (flow_table.h).
struct Fq::Table : detail::FlowTable<Fq::Flow> {
  using FlowTable::FlowTable;
};

}  // namespace sluice
