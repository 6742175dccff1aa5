// The stage's hot path: the per-thread snapshot cache, statistics shard
// leases, Stage::enforce and settle, and creating and shutting down a stage
// (rules in stage_apply.cc, reports in stage_report.cc, snapshots in
// snapshot.cc). A thread keeps the snapshot it used last in an initial-exec
// TLS cache and takes `snap_mu` only when the stage's version moved; routing
// is a per-thread memo over hash lookups; statistics go to leased shards.
#include "sluice/stage.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstddef>

#include "sluice/stage_fast.h"
#include "stage_impl.h"
#include "tls.h"

namespace sluice {
namespace detail {
namespace {

// ---------------------------------------------------------------------------
// Statistics shard leases.

SLUICE_TLS thread_local unsigned t_shard = ~0u;

// An exclusive shard's lease ends (its thread exits). A function of its own:
// the analysis does not check destructors.
void give_back_shard(unsigned shard) {
  ShardAllocator& a = shard_allocator();
  MutexLock lock(a.mu);
  a.free_list.push_back(shard);
}

struct ShardLease {
  ~ShardLease() {
    t_thread_context.fast = {};  // points into the shard given up here
    if (t_shard < static_cast<unsigned>(kExclusiveShards)) give_back_shard(t_shard);
    t_shard = ~0u;
  }
};
thread_local ShardLease t_lease;

[[gnu::noinline]] unsigned lease_shard() noexcept {
  ShardAllocator& a = shard_allocator();
  unsigned s;
  {
    MutexLock lock(a.mu);
    if (!a.free_list.empty()) {
      s = a.free_list.back();
      a.free_list.pop_back();
    } else if (a.next < static_cast<unsigned>(kExclusiveShards)) {
      s = a.next++;
      a.extent.store(a.next, std::memory_order_release);
    } else {
      s = static_cast<unsigned>(kExclusiveShards) +
          (a.shared_next++ % static_cast<unsigned>(kSharedShards));
      a.extent.store(static_cast<unsigned>(kShards), std::memory_order_release);
    }
  }
  t_shard = s;
  (void)&t_lease;  // registers the lease's destructor for this thread
  return s;
}

inline unsigned my_shard() noexcept {
  unsigned s = t_shard;
  if (s == ~0u) [[unlikely]]
    s = lease_shard();
  return s;
}

// ---------------------------------------------------------------------------
// The per-thread snapshot cache.

// The memo missed: route through the snapshot's tables and remember it.
// The key is recomputed here rather than passed, so the hot path compares it
// in registers and never spills it for this (cold) call.
[[gnu::noinline]] Target route_and_memo(CacheEntry& e, const Context& ctx) noexcept {
  Target t = e.snap->route(ctx);
  e.memo_key = masked(ctx, e.memo_mask);
  e.memo = t;
  e.memo_plain = t.object == nullptr ? t.stats : nullptr;
  return t;
}
// Where `ctx` goes in the snapshot `e` holds: the memo when it matches.
[[gnu::always_inline]] inline Target route_in(CacheEntry& e, const Context& ctx) noexcept {
  return (e.memo.stats != nullptr && masked(ctx, e.memo_mask) == e.memo_key)
             ? e.memo
             : route_and_memo(e, ctx);
}
// Counts one enforced request in this thread's shard of the target's block;
// nothing for one that would have waited and must not (it did not happen).
[[gnu::always_inline]] inline void record(const Target& t, const Context& ctx, Verdict v) noexcept {
  if (v.outcome == Outcome::kWouldWait) [[unlikely]]
    return;
  const unsigned shard = my_shard();
  t.stats->record(shard, shard < static_cast<unsigned>(kExclusiveShards), ctx.origin, ctx.size, v);
}

// The object's part of enforcing `ctx`, with its flags (sluice/context.h):
// a bounded pre-charge is the size the object sees; a request that must not
// wait is only tried.
[[gnu::noinline]] Verdict enforce_flagged(EnforcementObject& o, const Context& ctx) noexcept {
  Context c = ctx;
  c.size = pre_charge_of(ctx);
  return (ctx.flags & context_flag::kNoWait) != 0 ? o.try_enforce_context(c) : o.enforce_context(c);
}
inline Verdict enforce_object(EnforcementObject& o, const Context& ctx) noexcept {
  // A bounded request no larger than the bound is charged whole: as unflagged.
  if ((ctx.flags & context_flag::kNoWait) == 0 && pre_charge_of(ctx) == ctx.size) [[likely]]
    return o.enforce_context(ctx);
  return enforce_flagged(o, ctx);
}
constexpr int kCacheEntries = 4;
SLUICE_TLS thread_local std::array<CacheEntry, kCacheEntries> t_cache{};

struct CacheReleaser {
  ~CacheReleaser() {
    t_thread_context.fast = {};  // points into a snapshot released here
    for (CacheEntry& e : t_cache) {
      if (e.snap != nullptr) e.snap->unref();
      e = CacheEntry{};
    }
  }
};
thread_local CacheReleaser t_releaser;

std::atomic<std::uint64_t> g_next_uid{1};

}  // namespace

std::uint64_t next_uid() noexcept {
  return g_next_uid.fetch_add(1);
}

}  // namespace detail

using detail::CacheEntry;
using detail::Snapshot;

inline detail::Target Stage::Impl::route(const Context& ctx) noexcept {
  CacheEntry* e = &detail::t_cache[0];
  if (e->uid != uid || e->version != version.load(std::memory_order_acquire)) [[unlikely]] {
    e = refresh();
  }
  return detail::route_in(*e, ctx);
}

inline bool Stage::Impl::try_fast(const Context& ctx) noexcept {
  // Versions are unique across stages: no need to compare the uid too.
  const CacheEntry& e = detail::t_cache[0];
  if (e.version != version.load(std::memory_order_acquire) || e.memo_plain == nullptr ||
      !(detail::masked(ctx, e.memo_mask) == e.memo_key)) {
    return false;
  }
  const unsigned shard = detail::t_shard;
  if (shard >= static_cast<unsigned>(detail::kExclusiveShards)) return false;
  e.memo_plain->record_exclusive_ok(shard, ctx.origin, ctx.size);
  return true;
}

template <typename Call>
Verdict Stage::Impl::full(const Context& ctx, Call&& call) noexcept {
  return full_inline(ctx, call);
}
template <typename Call>
Verdict Stage::Impl::full_inline(const Context& ctx, Call&& call) noexcept {
  const int saved_errno = errno;
  InternalIoScope internal;
  const detail::Target t = route(ctx);
  if (t.feed != nullptr) t.feed->poll(*t.object);
  const Verdict v = call(t);
  detail::record(t, ctx, v);
  errno = saved_errno;
  return v;
}

void Stage::Impl::arm_fast_target(OriginId origin) noexcept {
  const CacheEntry& e = detail::t_cache[0];
  const unsigned shard = detail::t_shard;
  if (!e.by_origin_only || e.uid != uid || e.memo.stats == nullptr ||
      shard >= static_cast<unsigned>(detail::kExclusiveShards)) {
    return;
  }
  detail::FastTarget f;
  f.version = e.version;
  f.slot = e.memo.stats->slot(shard, origin);
  f.key = origin;
  if (e.memo.object != nullptr) {
    const FastGrant g = e.memo.object->fast_grant();
    if (!g) return;  // the last shortcut armed stays
    f.key |= detail::kFastGrantKey;
    f.grant = g.grant;
    f.grant_state = g.state;
    // Stage::board() and apply publish a new version when they give a slot.
    f.board = e.memo.feed != nullptr ? e.memo.feed->slot.load(std::memory_order_acquire) : nullptr;
  }
  detail::t_thread_context.fast = f;
}

Verdict Stage::Impl::full_and_arm(const Context& ctx) noexcept {
  const Verdict v = full_inline(ctx, [&](const detail::Target& t) {
    return t.object != nullptr ? detail::enforce_object(*t.object, ctx) : Verdict{};
  });
  const CacheEntry& e = detail::t_cache[0];
  if (e.by_origin_only) {
    // Not again for a shortcut already armed here (a grant that refused).
    const detail::FastTarget& f = detail::t_thread_context.fast;
    if (f.version != e.version || static_cast<OriginId>(f.key) != ctx.origin)
      arm_fast_target(ctx.origin);
  }
  return v;
}

CacheEntry* Stage::Impl::refresh() noexcept {
  auto& cache = detail::t_cache;
  // The shortcut may point into a snapshot this refresh releases.
  detail::t_thread_context.fast = {};
  (void)&detail::t_releaser;  // registers the release of cached snapshots at thread exit
  std::size_t i = 0;
  while (i < cache.size() && cache[i].uid != uid) ++i;
  if (i == cache.size()) i = cache.size() - 1;  // evict the last entry
  CacheEntry e = cache[i];
  for (std::size_t j = i; j > 0; --j) cache[j] = cache[j - 1];  // move to front
  if (e.uid != uid || e.version != version.load(std::memory_order_acquire)) {
    if (e.snap != nullptr) e.snap->unref();
    Snapshot* s;
    {
      MutexLock lock(snap_mu);
      s = current;
      s->ref();
    }
    e = CacheEntry{};
    e.uid = uid;
    e.snap = s;
    e.version = s->version;
    e.memo_mask = s->memo_mask;
    e.by_origin_only = detail::by_origin_only(s->memo_mask);
  }
  cache[0] = e;
  return &cache[0];
}

Stage::Stage(std::unique_ptr<Impl> impl) : impl_(std::move(impl)), version_(&impl_->version) {}
Stage::~Stage() = default;

StatusOr<std::unique_ptr<Stage>> Stage::create(StageOptions options) {
  if (!valid_stage_name(options.name)) {
    return Status::invalid("stage name must be " + std::string(kStageNameRule) + ", got '" +
                           options.name + "'");
  }
  auto impl = std::make_unique<Impl>();
  impl->name = std::move(options.name);
  impl->labels = std::move(options.labels);
  impl->clock = options.clock != nullptr ? options.clock : &system_clock();
  impl->registry = options.registry != nullptr ? options.registry : &Registry::global();
  impl->pid = ::getpid();
  {
    // Not shared yet; held for the analysis, which cannot know that.
    MutexLock lock(impl->control_mu);
    impl->created_ns = impl->clock->now_ns();
    impl->last_collect_ns = impl->created_ns;
    auto snap = detail::build_snapshot(impl->model, detail::next_version(), impl->unclassified);
    if (!snap.is_ok()) return snap.status();
    impl->publish_locked(snap.value());
  }
  return std::unique_ptr<Stage>(new Stage(std::move(impl)));
}

Verdict Stage::enforce(const Context& ctx) noexcept {
  return fast::enforce(*this, ctx);
}

Verdict Stage::enforce_rest(const Context& ctx) noexcept {
  Impl& s = *impl_;
  // The memo's inline common case stays free of calls and a stack frame: a
  // stage whose entry selects on something besides the origin (the only kind
  // that gets here every time) pays one flag test for the shortcut. One that
  // selects by origin gets here when a thread changes origin, or after a
  // request its shortcut could not take (an object that waits).
  if (s.try_fast(ctx)) [[likely]] {
    if (detail::t_cache[0].by_origin_only) [[unlikely]]
      s.arm_fast_target(ctx.origin);
    return {};
  }
  // try_fast refuses every place with an object: the grant's shortcut is
  // tried next, out of line so that the memo's case keeps no stack frame.
  return grant_or_full(ctx);
}

Verdict Stage::grant_or_full(const Context& ctx) noexcept {
  // The grant covers the request's flags: it never waits, and a request it
  // takes is charged whole.
  if (fast::try_grant(*this, ctx.origin, ctx.size)) return {};
  return impl_->full_and_arm(ctx);
}

void Stage::settle(const Context& ctx, std::uint64_t actual_bytes) noexcept {
  const std::uint64_t charged = pre_charge_of(ctx);
  if (actual_bytes == ctx.size && charged == ctx.size) return;
  Impl& s = *impl_;
  // Correct only within the snapshot that counted the request. This thread's
  // front cache entry is that snapshot unless the rules changed since enforce()
  // (or the thread enforced on other stages in between): then the correction
  // is dropped, because applied to a block that never counted the request it
  // could take that block's bytes below zero.
  CacheEntry& e = detail::t_cache[0];
  if (e.uid != s.uid || e.version != s.version.load(std::memory_order_acquire)) return;
  const detail::Target t = detail::route_in(e, ctx);
  const unsigned shard = detail::my_shard();
  const bool exclusive = shard < static_cast<unsigned>(detail::kExclusiveShards);
  if (actual_bytes != ctx.size) {
    t.stats->adjust(shard, exclusive, ctx.origin, ctx.size, actual_bytes);
  }
  if (t.object != nullptr && actual_bytes != charged) {
    // The object's share, which may wait: as full() does, with errno kept
    // and any I/O the wait makes internal. This thread's cache entry keeps
    // the snapshot, hence the object and its counters, alive meanwhile.
    const int saved_errno = errno;
    InternalIoScope internal;
    Context c = ctx;
    c.size = charged;
    const Verdict v = t.object->settle(c, actual_bytes);
    t.stats->record_settle_wait(shard, exclusive, v);
    errno = saved_errno;
  }
}

Hold Stage::acquire(const Context& ctx, std::uint64_t amount) noexcept {
  Impl& s = *impl_;
  Context c = ctx;
  c.size = amount;
  c.flags &= static_cast<std::uint8_t>(~context_flag::kBounded);  // charged whole
  std::shared_ptr<EnforcementObject> holder;
  const Verdict v = s.full(c, [&](const detail::Target& t) -> Verdict {
    if (t.object == nullptr) return {};
    if (!t.object->holds_capacity()) return detail::enforce_object(*t.object, c);
    // route() made this stage's snapshot the thread's front cache entry; its
    // reference keeps the object alive until the Hold has its own.
    holder = detail::t_cache[0].snap->holder_of(t.object);
    SLUICE_DCHECK(holder != nullptr,
                  "a snapshot lists every object it routes to that holds capacity");
    return t.object->acquire(c, amount);
  });
  if (holder == nullptr) return Hold(v);
  return Hold(std::move(holder), c, amount, v);
}

StatusOr<int> Stage::board() {
  Impl& s = *impl_;
  MutexLock lock(s.control_mu);
  if (!s.board) {
    auto b = detail::StageBoard::create();
    if (!b.is_ok()) return b.status();
    s.board = std::move(b).value();
    for (auto& c : s.model.channels) {
      for (auto& o : c.objects) s.give_slot_locked(*o.mech);
    }
    // The same layout under a new version: threads' shortcuts, which read an
    // object's slot when they arm, arm again with it. (It builds: the layout
    // is the one in force.)
    if (!s.shut_down) {
      auto snap = detail::build_snapshot(s.model, detail::next_version(), s.unclassified);
      if (snap.is_ok()) s.publish_locked(snap.value());
    }
  }
  return s.board->fd();
}

std::uint64_t Stage::board_updates() const noexcept {
  return impl_->board_taken.load(std::memory_order_relaxed);
}

std::uint64_t Stage::rules_version() const {
  MutexLock lock(impl_->control_mu);
  return impl_->rules_version;
}

const std::string& Stage::name() const noexcept {
  return impl_->name;
}
Clock& Stage::clock() const noexcept {
  return *impl_->clock;
}

void Stage::shutdown() noexcept {
  Impl& s = *impl_;
  MutexLock lock(s.control_mu);
  if (s.shut_down) return;
  s.shut_down = true;
  detail::Model empty;
  auto snap = detail::build_snapshot(empty, detail::next_version(), s.unclassified);
  if (snap.is_ok()) s.publish_locked(snap.value());
  for (auto& c : s.model.channels) {
    for (auto& o : c.objects) o.mech->object->shutdown();
  }
}

}  // namespace sluice
