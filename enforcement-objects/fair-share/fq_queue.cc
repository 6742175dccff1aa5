// The fq object's queue (sluice/objects/fq.h): its bucket of work, its
// waiters and the heap of flows that orders them, and the leases of the
// no-wait path.
#include <algorithm>
#include <cstdint>

#include "fq_internal.h"
#include "sluice/dcheck.h"

namespace sluice {

using namespace fq_detail;

Fq::Waiter* Fq::head_locked() const {
  return heap_.empty() ? nullptr : heap_.front()->head;
}

std::int64_t Fq::cap_locked() const {
  const Waiter* h = head_locked();
  return (h != nullptr ? std::max(burst_, h->cost) : burst_) - leased_work_;
}

std::int64_t Fq::head_deadline_locked() const {
  const std::int64_t need = head_locked()->cost - bucket_;
  return need <= 0 ? last_ns_ : last_ns_ + (need + kWorkPerNs - 1) / kWorkPerNs;
}

void Fq::accrue_locked(std::int64_t to_ns, std::int64_t cap) {
  if (to_ns <= last_ns_) return;  // a clock set back in time accrues nothing
  const std::int64_t elapsed = to_ns - last_ns_;
  last_ns_ = to_ns;
  if (bucket_ >= cap) return;
  const std::int64_t room = cap - bucket_;
  bucket_ = elapsed > room / kWorkPerNs ? cap : bucket_ + elapsed * kWorkPerNs;
}

void Fq::settle_locked(std::int64_t now) {
  Waiter* const old_head = head_locked();
  if (old_head != nullptr) {
    // Virtual time lags real time by at most one bucket: what is granted now
    // plus what is left stays within the head's cost plus the burst, however
    // late we got here. Past that, the work is forfeited, as a full bucket
    // forfeits it.
    const std::int64_t max_lag = burst_ / kWorkPerNs;
    const std::int64_t lag = now - head_deadline_locked();
    if (lag > max_lag) last_ns_ += lag - max_lag;
  }
  while (Waiter* h = head_locked()) {
    const std::int64_t due = head_deadline_locked();
    if (due > now) break;
    accrue_locked(due, cap_locked());  // granted as of `due`, however late we got here
    SLUICE_DCHECK(bucket_ >= h->cost, "the head is due when the bucket holds its cost");
    Waiter* w = pop_head_locked(now);
    vtime_ = w->start;
    take_locked(w->flow, w->cost, w->op_class, w->bytes, w->counts_op);
    w->granted = true;
    w->cv.notify_one();
  }
  if (vtime_ >= kRebaseAt) rebase_locked();
  if (head_locked() == nullptr) {
    accrue_locked(now, cap_locked());  // the leases as last seen count as spent now
    look_at_leases_locked();
  } else {
    head_changed_locked(old_head);  // the new head now sleeps until its own deadline
  }
  check_invariants_locked();
}

void Fq::wait_as_head_locked(MutexLock& lock, Waiter& self) {
  const std::int64_t deadline = head_deadline_locked();
  if (clock_->now_ns() >= deadline) return;  // the caller's settle grants it
  clock_->wait_until(lock.native(), self.cv, deadline);
}

void Fq::head_changed_locked(Waiter* old_head) {
  Waiter* h = head_locked();
  if (h == old_head) return;
  if (old_head != nullptr && !old_head->granted && !old_head->cancelled) {
    old_head->cv.notify_one();
  }
  if (h != nullptr) h->cv.notify_one();
}

void Fq::push_locked(Waiter& w, std::int64_t now) {
  Flow& f = w.flow;
  if (f.queued == 0) f.backlog_since = now;
  (f.tail != nullptr ? f.tail->next : f.head) = &w;
  f.tail = &w;
  ++f.queued;
  ++queued_;
  f.arrivals_ns += w.arrived_ns;
  if (f.heap_pos < 0) {
    heap_.push_back(&f);
    f.heap_pos = static_cast<std::ptrdiff_t>(heap_.size() - 1);
    sift_up_locked(heap_.size() - 1);
  }
}

Fq::Waiter* Fq::pop_head_locked(std::int64_t now) {
  Flow* f = heap_.front();
  Waiter* w = f->head;
  f->head = w->next;
  if (f->head == nullptr) f->tail = nullptr;
  w->next = nullptr;
  --f->queued;
  --queued_;
  f->waited_ns += now - w->arrived_ns;
  f->arrivals_ns -= w->arrived_ns;
  if (f->queued != 0) {
    sift_down_locked(0);  // its start tag grew
    return w;
  }
  f->backlogged_ns += now - f->backlog_since;
  f->heap_pos = -1;
  Flow* last = heap_.back();
  heap_.pop_back();
  if (last != f) {
    heap_set_locked(0, last);
    sift_down_locked(0);
  }
  return w;
}

bool Fq::before_locked(const Flow* a, const Flow* b) const {
  const double sa = a->head->start;
  const double sb = b->head->start;
  return sa < sb || (sa == sb && a->index < b->index);
}

void Fq::heap_set_locked(std::size_t i, Flow* f) {
  heap_[i] = f;
  f->heap_pos = static_cast<std::ptrdiff_t>(i);
}

void Fq::sift_up_locked(std::size_t i) {
  Flow* f = heap_[i];
  while (i > 0) {
    const std::size_t parent = (i - 1) / 2;
    if (!before_locked(f, heap_[parent])) break;
    heap_set_locked(i, heap_[parent]);
    i = parent;
  }
  heap_set_locked(i, f);
}

void Fq::sift_down_locked(std::size_t i) {
  Flow* f = heap_[i];
  const std::size_t n = heap_.size();
  for (;;) {
    std::size_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && before_locked(heap_[child + 1], heap_[child])) ++child;
    if (!before_locked(heap_[child], f)) break;
    heap_set_locked(i, heap_[child]);
    i = child;
  }
  heap_set_locked(i, f);
}

void Fq::rebase_locked() {
  const double shift = vtime_;
  vtime_base_ += shift;
  vtime_ = 0;
  for (const auto& f : flows_) {
    f->finish -= shift;
    for (Waiter* w = f->head; w != nullptr; w = w->next) w->start -= shift;
  }
  // Rounding may tie tags that were apart: the heap is rebuilt.
  for (std::size_t i = heap_.size() / 2; i-- > 0;) sift_down_locked(i);
}

void Fq::recost_waiters_locked() {
  for (Flow* f : heap_) {
    for (Waiter* w = f->head; w != nullptr; w = w->next) {
      if (!w->counts_op) continue;  // a settlement's extra work keeps its cost
      const std::int64_t cost = cost_locked(w->op_class, w->bytes);
      f->arrived_work += cost - w->cost;
      w->cost = cost;
    }
  }
}

// ---------------------------------------------------------------------------
// Leases.

void Fq::lease_locked(Stripe& s, std::int64_t cost) {
  if (queued_ != 0 || shut_down_) return;  // none while anyone waits
  const std::uint64_t want = std::max(static_cast<std::uint64_t>(lease_size_),
                                      std::min(static_cast<std::uint64_t>(cost), kMaxBalance));
  if (bucket_ < static_cast<std::int64_t>(want)) return;  // scarce: grants go through the lock
  if (!s.leased) {
    if (leases_ == kMaxLeases) reclaim_lease_locked(*leased_[next_victim_++ % kMaxLeases]);
    leased_[leases_++] = &s;
    s.leased = true;
  }
  // The balance only falls meanwhile, so this keeps it within kMaxBalance.
  const std::uint64_t before = s.lease.load(std::memory_order_relaxed) >> kOpsBits;
  const std::uint64_t amount = std::min(want, kMaxBalance - before);
  if (amount == 0) return;
  const std::uint64_t balance =
      s.lease.fetch_add(amount << kOpsBits, std::memory_order_relaxed) >> kOpsBits;
  fold_paid_locked(s, balance);
  leased_work_ += static_cast<std::int64_t>(amount);
  s.seen += amount;
  bucket_ -= static_cast<std::int64_t>(amount);
}

void Fq::fold_paid_locked(Stripe& s, std::uint64_t balance) {
  // Balances only fall outside the lock.
  const auto paid = static_cast<std::int64_t>(s.seen - balance);
  s.flow->served_work += paid;
  s.flow->arrived_work += paid;
  leased_work_ -= paid;
  s.seen = balance;
}

void Fq::look_at_leases_locked() {
  for (unsigned i = 0; i < leases_;) {
    Stripe& s = *leased_[i];
    fold_paid_locked(s, s.lease.load(std::memory_order_relaxed) >> kOpsBits);
    if (s.seen != 0) {
      ++i;
      continue;
    }
    s.leased = false;
    leased_[i] = leased_[--leases_];
  }
}

void Fq::reclaim_lease_locked(Stripe& s) {
  // Takes the balance, leaves the grant count.
  const std::uint64_t balance = s.lease.fetch_and(kOpsMask, std::memory_order_relaxed) >> kOpsBits;
  fold_paid_locked(s, balance);
  bucket_ += static_cast<std::int64_t>(balance);
  leased_work_ -= static_cast<std::int64_t>(balance);
  s.seen = 0;
  s.leased = false;
  for (unsigned i = 0; i < leases_; ++i) {
    if (leased_[i] == &s) {
      leased_[i] = leased_[--leases_];
      break;
    }
  }
}

void Fq::reclaim_leases_locked() {
  while (leases_ != 0) reclaim_lease_locked(*leased_[leases_ - 1]);
}

void Fq::fold_ops_locked(Stripe& s) {
  std::uint64_t w = s.lease.load(std::memory_order_relaxed);
  while (!s.lease.compare_exchange_weak(w, w & ~kOpsMask, std::memory_order_relaxed)) {
  }
  s.flow->served_ops += w & kOpsMask;
}

void Fq::check_invariants_locked() const {
#ifndef NDEBUG
  std::uint64_t queued = 0;
  for (const auto& p : flows_) {
    const Flow& f = *p;
    std::uint64_t n = 0;
    const Waiter* last = nullptr;
    for (const Waiter* w = f.head; w != nullptr; w = w->next) {
      SLUICE_DCHECK(&w->flow == &f, "a waiter is queued in its own flow");
      SLUICE_DCHECK(last == nullptr || last->start <= w->start,
                    "a flow's start tags grow in order of arrival");
      last = w;
      ++n;
    }
    SLUICE_DCHECK(n == f.queued && last == f.tail, "a flow's queue, tail and count agree");
    SLUICE_DCHECK((f.heap_pos >= 0) == (f.queued != 0), "a flow is in the heap iff it has waiters");
    for (const Stripe& s : f.stripes) {
      SLUICE_DCHECK(s.leased || s.seen == 0, "a stripe outside leased_ holds no lease");
    }
    queued += n;
  }
  SLUICE_DCHECK(queued == queued_, "queued_ counts every flow's waiters");
  for (std::size_t i = 0; i < heap_.size(); ++i) {
    SLUICE_DCHECK(heap_[i]->heap_pos == static_cast<std::ptrdiff_t>(i),
                  "a flow knows its place in the heap");
    SLUICE_DCHECK(i == 0 || !before_locked(heap_[i], heap_[(i - 1) / 2]),
                  "no flow in the heap comes before its parent");
  }
  std::int64_t seen = 0;
  for (unsigned i = 0; i < leases_; ++i) {
    SLUICE_DCHECK(leased_[i]->leased, "leased_ holds the stripes with a lease");
    seen += static_cast<std::int64_t>(leased_[i]->seen);
  }
  SLUICE_DCHECK(seen == leased_work_,
                "leased_work_ is the sum of what the leases were last seen to hold");
  SLUICE_DCHECK(queued_ == 0 || leases_ == 0, "no lease is out while a request waits");
  if (configured_) {
    SLUICE_DCHECK(bucket_ <= cap_locked(), "the bucket holds no more than its cap");
  }
#endif
}

}  // namespace sluice
