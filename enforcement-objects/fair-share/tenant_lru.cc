// TenantLru (sluice/objects/tenant_lru.h): the owners' heaps, the victim
// choice and the thresholds.
#include "sluice/objects/tenant_lru.h"

#include "sluice/dcheck.h"

namespace sluice {

TenantLru::TenantLru(const std::atomic<std::uint64_t>* epoch, unsigned share_shift) noexcept
    : epoch_(epoch), share_shift_(share_shift) {
  if (epoch_ != nullptr) seen_epoch_ = epoch_->load(std::memory_order_acquire);
}

TenantLru::~TenantLru() = default;

TenantLru::OwnerId TenantLru::add_owner(const std::atomic<std::uint64_t>* reserved) {
  auto o = std::make_unique<Owner>();
  o->head.prev = o->head.next = &o->head;
  o->id = static_cast<OwnerId>(owners_.size());
  o->reserved = reserved;
  if (reserved != nullptr) o->threshold = share_of(reserved->load(std::memory_order_relaxed));
  // The heaps never allocate on the way of a request.
  all_.v.reserve(owners_.size() + 1);
  over_.v.reserve(owners_.size() + 1);
  owners_.push_back(std::move(o));
  return owners_.back()->id;
}

void TenantLru::set_threshold(OwnerId o, std::uint64_t bytes) noexcept {
  Owner& w = *owners_[o];
  w.threshold = bytes;
  fix(w);
}

void TenantLru::reload_thresholds() noexcept {
  for (auto& o : owners_) {
    if (o->reserved == nullptr) continue;
    o->threshold = share_of(o->reserved->load(std::memory_order_relaxed));
    fix(*o);
  }
}

TenantLru::Node* TenantLru::evict(OwnerId inserting, std::uint64_t incoming) noexcept {
  if (epoch_ != nullptr) {
    const std::uint64_t e = epoch_->load(std::memory_order_acquire);
    if (e != seen_epoch_) [[unlikely]] {
      seen_epoch_ = e;
      reload_thresholds();
    }
  }
  // The least recently used tail among the owners above their threshold;
  // if none, the inserting owner's own when what it brings puts it above;
  // else the least recently used of everyone.
  Owner* best = over_.v.empty() ? nullptr : over_.v[0];
  bool below = false;
  if (best == nullptr) {
    Owner& ins = *owners_[inserting];
    if (!ins.empty() && ins.usage + incoming > ins.threshold) {
      best = &ins;
    } else if (!all_.v.empty()) {
      best = all_.v[0];
      below = true;
    } else {
      return nullptr;
    }
  }
  Node& victim = *best->head.prev;
  SLUICE_DCHECK(victim.linked && victim.owner == best->id, "a list's tail is its owner's entry");
  ++steps_;
  unlink(victim, *best);
  unaccount(victim, *best);
  ++best->evictions;
  if (below) ++best->evictions_below;
  fix(*best);
  return &victim;
}

TenantLruStats TenantLru::stats(OwnerId id) const noexcept {
  const Owner& o = *owners_[id];
  TenantLruStats s;
  s.usage = o.usage;
  s.pinned = o.usage - o.linked_usage;
  s.entries = o.entries;
  s.hits = o.hits;
  s.misses = o.misses;
  s.inserts = o.inserts;
  s.inserted_bytes = o.inserted_bytes;
  s.evictions = o.evictions;
  s.evictions_below_reserved = o.evictions_below;
  return s;
}

void TenantLru::place(Heap& h, Owner& o, bool member) noexcept {
  const std::uint32_t i = o.*h.pos;
  if (i == kNone) {
    if (!member) return;
    const auto n = static_cast<std::uint32_t>(h.v.size());
    h.v.push_back(&o);  // capacity reserved in add_owner: no allocation
    o.*h.pos = n;
    sift_up(h, n);
    return;
  }
  if (!member) {
    Owner* last = h.v.back();
    h.v.pop_back();
    o.*h.pos = kNone;
    if (last != &o) {
      set(h, i, last);
      sift_up(h, i);
      sift_down(h, last->*h.pos);
    }
    return;
  }
  sift_up(h, i);
  sift_down(h, o.*h.pos);
}

void TenantLru::sift_up(Heap& h, std::uint32_t i) noexcept {
  Owner* o = h.v[i];
  const std::uint64_t key = o->tail_tick();
  while (i > 0) {
    const std::uint32_t parent = (i - 1) / 2;
    if (h.v[parent]->tail_tick() <= key) break;
    set(h, i, h.v[parent]);
    i = parent;
    ++steps_;
  }
  set(h, i, o);
}

void TenantLru::sift_down(Heap& h, std::uint32_t i) noexcept {
  Owner* o = h.v[i];
  const std::uint64_t key = o->tail_tick();
  const auto n = static_cast<std::uint32_t>(h.v.size());
  for (;;) {
    std::uint32_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && h.v[child + 1]->tail_tick() < h.v[child]->tail_tick()) ++child;
    if (key <= h.v[child]->tail_tick()) break;
    set(h, i, h.v[child]);
    i = child;
    ++steps_;
  }
  set(h, i, o);
}

void TenantLru::check_invariants() const {
#ifndef NDEBUG
  std::uint64_t usage = 0;
  std::uint64_t linked = 0;
  for (const auto& p : owners_) {
    const Owner& o = *p;
    std::uint64_t on_list = 0;
    std::uint64_t last_tick = ~std::uint64_t{0};
    for (const Node* n = o.head.next; n != &o.head; n = n->next) {
      SLUICE_DCHECK(n->linked && n->owner == o.id, "a listed entry is linked and its owner's");
      SLUICE_DCHECK(n->next->prev == n, "a list's links agree");
      SLUICE_DCHECK(n->tick < last_tick, "a list runs from the most to the least recent");
      last_tick = n->tick;
      on_list += n->charge;
    }
    SLUICE_DCHECK(on_list == o.linked_usage && o.linked_usage <= o.usage,
                  "an owner's linked usage is its list's charges, within its usage");
    SLUICE_DCHECK((o.pos_all != kNone) == !o.empty(), "the owners with a linked entry are in all_");
    SLUICE_DCHECK((o.pos_over != kNone) == (!o.empty() && o.usage > o.threshold),
                  "the owners above their threshold with a linked entry are in over_");
    usage += o.usage;
    linked += o.linked_usage;
  }
  SLUICE_DCHECK(usage == usage_ && linked == linked_usage_, "the totals are the owners' sums");
  for (const Heap* h : {&all_, &over_}) {
    for (std::uint32_t i = 0; i < h->v.size(); ++i) {
      SLUICE_DCHECK(h->v[i]->*h->pos == i, "a heap's positions agree");
      SLUICE_DCHECK(i == 0 || h->v[(i - 1) / 2]->tail_tick() <= h->v[i]->tail_tick(),
                    "a heap is ordered by its owners' tails");
    }
  }
#endif
}

}  // namespace sluice
