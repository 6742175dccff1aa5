// DrftCore (sluice/objects/drft_core.h): virtual times over dominant item
// usage, the memoryless start, the Δ bound and the throughput picker.
#include "sluice/objects/drft_core.h"

#include <algorithm>
#include <bit>
#include <limits>

#include "sluice/dcheck.h"

namespace sluice::drft {
namespace {

std::size_t pow2_at_least(std::size_t n) {
  return std::bit_ceil(std::max<std::size_t>(n, 16));
}

// How much a lock wait or a conflict counts in the sketch, against 1 per access.
constexpr std::uint32_t kContentionWeight = 4;
// The weight of a transaction's usage in its tenant's prediction.
constexpr double kPredictionGain = 0.25;

}  // namespace

// ---------------------------------------------------------------------------
// ItemCounts

void ItemCounts::reset(std::size_t capacity) {
  const std::size_t c = pow2_at_least(capacity);
  slots_.assign(c, Slot{});
  shift_ = 64 - static_cast<unsigned>(std::countr_zero(c));
  size_ = 0;
}

void ItemCounts::add(ItemId item, std::uint32_t n) {
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = home(item);; i = (i + 1) & mask) {
    if (slots_[i].item == item) {
      slots_[i].count += n;
      return;
    }
    if (slots_[i].item == 0) {
      if (2 * (size_ + 1) > slots_.size()) return;  // full for its contract: not counted
      slots_[i] = {item, n};
      ++size_;
      return;
    }
  }
}

std::uint32_t ItemCounts::get(ItemId item) const noexcept {
  if (slots_.empty()) return 0;
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = home(item);; i = (i + 1) & mask) {
    if (slots_[i].item == item) return slots_[i].count;
    if (slots_[i].item == 0) return 0;
  }
}

void ItemCounts::remove(ItemId item, std::uint32_t n) {
  if (slots_.empty()) return;
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = home(item);
  while (slots_[i].item != item) {
    if (slots_[i].item == 0) return;
    i = (i + 1) & mask;
  }
  if (slots_[i].count > n) {
    slots_[i].count -= n;
    return;
  }
  // Backward-shift deletion: later entries of the probe run move into the hole.
  --size_;
  for (std::size_t j = (i + 1) & mask;; j = (j + 1) & mask) {
    if (slots_[j].item == 0) break;
    const std::size_t h = home(slots_[j].item);
    // Entry j may fill the hole at i when its home is not in (i, j].
    if (((j - h) & mask) >= ((j - i) & mask)) {
      slots_[i] = slots_[j];
      i = j;
    }
  }
  slots_[i] = Slot{};
}

// ---------------------------------------------------------------------------
// CountMin

void CountMin::reset(std::uint32_t width, std::uint32_t depth) {
  width_ = width;
  depth_ = depth;
  counters_.assign(std::size_t{width} * depth, 0);
  total_ = 0;
  window_ = std::uint64_t{width} * 4;
}

std::size_t CountMin::index(unsigned row, ItemId item) const noexcept {
  std::uint64_t h = item + (std::uint64_t{row} + 1) * 0x9E3779B97F4A7C15ULL;
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 29;
  return std::size_t{row} * width_ + static_cast<std::size_t>(h & (width_ - 1));
}

void CountMin::add(ItemId item, std::uint32_t n) noexcept {
  if (width_ == 0) return;
  for (unsigned r = 0; r < depth_; ++r) {
    std::uint32_t& c = counters_[index(r, item)];
    c = c > std::numeric_limits<std::uint32_t>::max() - n
            ? std::numeric_limits<std::uint32_t>::max()
            : c + n;
  }
  total_ += n;
  if (total_ >= window_) {  // an old burst fades: every count halves
    for (std::uint32_t& c : counters_) c >>= 1;
    total_ >>= 1;
  }
}

std::uint32_t CountMin::estimate(ItemId item) const noexcept {
  if (width_ == 0) return 0;
  std::uint32_t m = std::numeric_limits<std::uint32_t>::max();
  for (unsigned r = 0; r < depth_; ++r) m = std::min(m, counters_[index(r, item)]);
  return m;
}

// ---------------------------------------------------------------------------
// Core

Core::Core() {
  configure(Settings{});
}

void Core::configure(const Settings& s) {
  const bool resketch = s.sketch_width != s_.sketch_width || s.sketch_depth != s_.sketch_depth ||
                        sketch_.bytes() == 0;
  s_ = s;
  for (auto& t : tenants_) {
    if (t->other) continue;
    auto it = s_.weights.find(t->id);
    t->weight = it != s_.weights.end() ? it->second : s_.default_weight;
  }
  if (other_ != nullptr) other_->weight = s_.default_weight;
  if (resketch) sketch_.reset(s_.sketch_width, s_.sketch_depth);
  const std::size_t want = pow2_at_least(2 * std::size_t{s_.slots} * kMaxItems);
  if (running_items_.capacity() < want) {
    // Re-count what is running into the larger table.
    running_items_.reset(want);
    for (Txn* x : index_) {
      if (x == nullptr) continue;
      for (std::uint8_t i = 0; i < x->n_items; ++i) running_items_.add(x->items[i], 1);
    }
  }
  while (index_.size() < 2 * std::size_t{s_.slots}) grow_index();
  // A record per slot now, so that admitting allocates nothing.
  while (txn_pool_.size() < s_.slots) {
    txn_pool_.push_back(std::make_unique<Txn>());
    free_txns_.push_back(txn_pool_.back().get());
  }
}

Tenant& Core::tenant(std::uint32_t id) {
  if (auto it = by_id_.find(id); it != by_id_.end()) return *it->second;
  const bool other = tenants_.size() >= s_.max_tenants;
  if (other && other_ != nullptr) return *other_;
  auto t = std::make_unique<Tenant>();
  t->id = id;
  t->other = other;
  auto w = s_.weights.find(id);
  t->weight = !other && w != s_.weights.end() ? w->second : s_.default_weight;
  t->vt = vsys_;
  Tenant* p = t.get();
  tenants_.push_back(std::move(t));
  if (other) {
    other_ = p;
  } else {
    by_id_.emplace(id, p);
  }
  return *p;
}

void Core::arrive(Tenant& t) {
  if (t.active_at >= 0) return;  // backlogged already: its start is its last finish
  // Memoryless: no credit for the time away. The least virtual time of the
  // backlogged tenants, or the system's when none is.
  double floor = vsys_;
  if (!active_.empty()) {
    floor = std::numeric_limits<double>::infinity();
    for (const Tenant* a : active_) floor = std::min(floor, a->vt);
  }
  t.vt = std::max(t.vt, floor);
  t.active_at = static_cast<std::int32_t>(active_.size());
  active_.push_back(&t);
}

void Core::leave_if_idle(Tenant& t) {
  if (t.running != 0 || t.queued != 0 || t.active_at < 0) return;
  const auto i = static_cast<std::size_t>(t.active_at);
  active_[i] = active_.back();
  active_[i]->active_at = static_cast<std::int32_t>(i);
  active_.pop_back();
  t.active_at = -1;
}

Txn* Core::start(Tenant& t, std::uint64_t txn_id, std::span<const ItemId> items,
                 std::int64_t now_ns) {
  SLUICE_DCHECK(running_ < s_.slots || s_.slots == 0, "a transaction starts only in a free slot");
  Txn* x = nullptr;
  if (!free_txns_.empty()) {
    x = free_txns_.back();
    free_txns_.pop_back();
  } else {
    txn_pool_.push_back(std::make_unique<Txn>());
    x = txn_pool_.back().get();
  }
  *x = Txn{};
  x->id = txn_id;
  x->tenant = &t;
  x->admitted_ns = now_ns;
  // The items it will hold, for the picker: declared, else its tenant's last hot ones.
  if (items.empty()) items = std::span<const ItemId>(t.predicted, t.n_predicted);
  for (ItemId item : items.first(std::min(items.size(), kMaxItems))) {
    if (item == 0) continue;
    x->items[x->n_items++] = item;
    running_items_.add(item, 1);
  }
  vsys_ = std::max(vsys_, t.vt);
  x->charged_ns = t.est_ns;
  t.vt += t.est_ns / t.weight;
  ++t.running;
  ++t.admitted;
  ++running_;
  index_put(x);
  return x;
}

Txn* Core::admit_now(Tenant& t, std::uint64_t txn_id, std::span<const ItemId> declared,
                     std::int64_t now_ns) {
  arrive(t);
  return start(t, txn_id, declared, now_ns);
}

void Core::enqueue(Waiter& w) {
  Tenant& t = *w.tenant;
  arrive(t);
  w.seq = next_seq_++;
  w.next = nullptr;
  w.txn = nullptr;
  if (t.tail != nullptr) {
    t.tail->next = &w;
  } else {
    t.head = &w;
    t.waiting_at = static_cast<std::int32_t>(waiting_.size());
    waiting_.push_back(&t);
  }
  t.tail = &w;
  ++t.queued;
  ++queued_;
  ++t.waits;
  check_invariants(t);
}

void Core::unlink_waiting(Tenant& t) {
  const auto i = static_cast<std::size_t>(t.waiting_at);
  waiting_[i] = waiting_.back();
  waiting_[i]->waiting_at = static_cast<std::int32_t>(i);
  waiting_.pop_back();
  t.waiting_at = -1;
}

void Core::remove(Waiter& w) {
  Tenant& t = *w.tenant;
  Waiter* prev = nullptr;
  for (Waiter* p = t.head; p != nullptr; prev = p, p = p->next) {
    if (p != &w) continue;
    (prev != nullptr ? prev->next : t.head) = p->next;
    if (t.tail == p) t.tail = prev;
    --t.queued;
    --queued_;
    if (t.head == nullptr) unlink_waiting(t);
    leave_if_idle(t);
    return;
  }
}

std::vector<Waiter*> Core::drain() {
  std::vector<Waiter*> all;
  while (!waiting_.empty()) {
    Tenant& t = *waiting_.back();
    Waiter* w = t.head;
    all.push_back(w);
    remove(*w);
  }
  return all;
}

std::uint32_t Core::conflicts(const Waiter& w) const noexcept {
  std::span<const ItemId> items(w.items, w.n_items);
  if (items.empty()) items = std::span<const ItemId>(w.tenant->predicted, w.tenant->n_predicted);
  std::uint32_t n = 0;
  for (ItemId item : items) n += running_items_.get(item);
  return n;
}

Waiter* Core::pick() {
  if (waiting_.empty()) return nullptr;
  if (s_.fifo) {
    Tenant* first = waiting_.front();
    for (Tenant* t : waiting_) {
      if (t->head->seq < first->head->seq) first = t;
    }
    ++picks_in_order;
    return first->head;
  }
  // Before a tie: the earlier arrival.
  auto before = [](const Tenant* a, const Tenant* b) {
    return a->vt < b->vt || (a->vt == b->vt && a->head->seq < b->head->seq);
  };
  Tenant* fair = waiting_.front();
  for (Tenant* t : waiting_) {
    if (before(t, fair)) fair = t;
  }
  if (s_.delta_ns > 0 && waiting_.size() > 1) {
    double lo = std::numeric_limits<double>::infinity();
    double hi = -lo;
    for (const Tenant* a : active_) {
      lo = std::min(lo, a->vt);
      hi = std::max(hi, a->vt);
    }
    if (hi - lo <= s_.delta_ns) {
      Tenant* best = fair;
      std::uint32_t best_c = conflicts(*fair->head);
      for (Tenant* t : waiting_) {
        if (best_c == 0) break;
        const std::uint32_t c = conflicts(*t->head);
        if (c < best_c || (c == best_c && before(t, best))) {
          best = t;
          best_c = c;
        }
      }
      if (best != fair) {
        ++picks_throughput;
        return best->head;
      }
    }
  }
  ++picks_fair;
  return fair->head;
}

Waiter* Core::dispatch_one(std::int64_t now_ns) {
  if (running_ >= s_.slots) return nullptr;
  Waiter* w = pick();
  if (w == nullptr) return nullptr;
  Tenant& t = *w->tenant;
  t.head = w->next;
  if (t.head == nullptr) {
    t.tail = nullptr;
    unlink_waiting(t);
  }
  --t.queued;
  --queued_;
  t.wait_ns += static_cast<double>(std::max<std::int64_t>(0, now_ns - w->arrived_ns));
  w->next = nullptr;
  w->txn = start(t, w->txn_id, std::span<const ItemId>(w->items, w->n_items), now_ns);
  check_invariants(t);
  return w;
}

bool Core::hot(ItemId item) const noexcept {
  const std::uint32_t e = sketch_.estimate(item);
  return e >= 2 && static_cast<double>(e) >= s_.hot_share * static_cast<double>(sketch_.total());
}

void Core::lock_wait(Txn* waiter, std::uint32_t waiter_tenant, ItemId item,
                     std::span<const std::uint32_t> blocker_tenants, double wait_ns,
                     bool held_items) {
  Tenant& w = waiter != nullptr ? *waiter->tenant : tenant(waiter_tenant);
  if (waiter == nullptr) ++unknown_ends;
  ++w.lock_waits;
  w.lock_wait_ns += wait_ns;
  if (item != 0) sketch_.add(item, kContentionWeight);
  if (!held_items || blocker_tenants.empty() || wait_ns <= 0) return;
  // The wait kept the waiter's items from others: shared equally among the
  // waiter and the transactions it waited for.
  const double share = wait_ns / static_cast<double>(blocker_tenants.size() + 1);
  for (std::uint32_t b : blocker_tenants) {
    Tenant& bt = tenant(b);
    bt.vt += share / bt.weight;
    bt.usage_ns += share;
    bt.sdu_charged_ns += share;
  }
  const double passed = wait_ns - share;
  w.sdu_credited_ns += passed;
  if (waiter != nullptr) waiter->credit_ns += passed;
}

void Core::end(Txn& x, const txn::TxnReport& r) {
  Tenant& t = *x.tenant;
  const std::int64_t from = r.first_access_ns != 0 ? r.first_access_ns : x.admitted_ns;
  const double baseline = static_cast<double>(std::max<std::int64_t>(0, r.end_ns - from));
  const double own = std::max(0.0, baseline - x.credit_ns);
  t.vt += (own - x.charged_ns) / t.weight;
  t.usage_ns += own;
  t.baseline_ns += baseline;
  t.est_ns = t.est_ns == 0 ? own : t.est_ns + kPredictionGain * (own - t.est_ns);
  switch (r.end) {
    case txn::TxnEnd::kCommitted:
      ++t.committed;
      break;
    case txn::TxnEnd::kAborted:
      ++t.aborted;
      break;
    case txn::TxnEnd::kConflict:
      ++t.conflicts;
      break;
  }
  // Hot items: counted, and the hot ones predict the tenant's next transaction.
  const std::uint32_t weight = r.end == txn::TxnEnd::kConflict ? kContentionWeight : 1;
  std::uint8_t n = 0;
  for (ItemId item : r.items.first(std::min(r.items.size(), kMaxItems))) {
    if (item == 0) continue;
    sketch_.add(item, weight);
    if (hot(item)) t.predicted[n++] = item;
  }
  if (!r.items.empty()) t.n_predicted = n;
  for (std::uint8_t i = 0; i < x.n_items; ++i) running_items_.remove(x.items[i], 1);
  --t.running;
  --running_;
  index_erase(&x);
  free_txns_.push_back(&x);
  leave_if_idle(t);
  check_invariants(t);
}

void Core::check_invariants(const Tenant& touched) const {
#ifndef NDEBUG
  // The touched tenant's queue, when short (a walk of a long one per call would make
  // debug builds quadratic).
  if (touched.queued <= 64) {
    std::uint32_t n = 0;
    for (const Waiter* w = touched.head; w != nullptr; w = w->next) {
      SLUICE_DCHECK(w->tenant == &touched, "a waiter is in its tenant's queue");
      SLUICE_DCHECK(w->next != nullptr || w == touched.tail, "the last waiter is the tail");
      ++n;
    }
    SLUICE_DCHECK(n == touched.queued, "a tenant's queued count matches its queue");
  }
  std::uint32_t queued = 0, running = 0;
  for (const auto& t : tenants_) {
    SLUICE_DCHECK((t->waiting_at >= 0) == (t->queued > 0), "a tenant with waiters is listed");
    SLUICE_DCHECK((t->active_at >= 0) == (t->running + t->queued > 0),
                  "a backlogged tenant is active");
    SLUICE_DCHECK(t->active_at < 0 || active_[static_cast<std::size_t>(t->active_at)] == t.get(),
                  "an active tenant's index is its place");
    SLUICE_DCHECK(t->waiting_at < 0 || waiting_[static_cast<std::size_t>(t->waiting_at)] == t.get(),
                  "a waiting tenant's index is its place");
    queued += t->queued;
    running += t->running;
  }
  SLUICE_DCHECK(queued == queued_, "queued is the tenants' sum");
  SLUICE_DCHECK(running == running_, "running is the tenants' sum");
  SLUICE_DCHECK(index_size_ == running_, "every running transaction is indexed");
#else
  (void)touched;
#endif
}

// ---------------------------------------------------------------------------
// The index of running transactions by id: linear probing, backward shift.

namespace {
std::size_t id_home(std::uint64_t id, std::size_t mask) {
  return static_cast<std::size_t>((id * 0x9E3779B97F4A7C15ULL) >> 17) & mask;
}
}  // namespace

void Core::grow_index() {
  std::vector<Txn*> old = std::move(index_);
  index_.assign(pow2_at_least(old.size() * 2), nullptr);
  index_size_ = 0;
  for (Txn* x : old) {
    if (x != nullptr) index_put(x);
  }
}

void Core::index_put(Txn* x) {
  if (2 * (index_size_ + 1) > index_.size()) grow_index();
  const std::size_t mask = index_.size() - 1;
  std::size_t i = id_home(x->id, mask);
  while (index_[i] != nullptr) i = (i + 1) & mask;
  index_[i] = x;
  ++index_size_;
}

Txn* Core::find(std::uint64_t txn_id) noexcept {
  if (index_.empty()) return nullptr;
  const std::size_t mask = index_.size() - 1;
  for (std::size_t i = id_home(txn_id, mask);; i = (i + 1) & mask) {
    if (index_[i] == nullptr) return nullptr;
    if (index_[i]->id == txn_id) return index_[i];
  }
}

void Core::index_erase(const Txn* x) {
  const std::size_t mask = index_.size() - 1;
  std::size_t i = id_home(x->id, mask);
  while (index_[i] != nullptr && index_[i] != x) i = (i + 1) & mask;
  if (index_[i] == nullptr) return;
  --index_size_;
  for (std::size_t j = (i + 1) & mask; index_[j] != nullptr; j = (j + 1) & mask) {
    const std::size_t h = id_home(index_[j]->id, mask);
    if (((j - h) & mask) >= ((j - i) & mask)) {
      index_[i] = index_[j];
      i = j;
    }
  }
  index_[i] = nullptr;
}

}  // namespace sluice::drft
