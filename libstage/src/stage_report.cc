// What a stage reports: its statistics (Stage::collect, Stage::totals),
// folded from the counters' shards, and its description (Stage::info).
#include <algorithm>
#include <iterator>
#include <map>
#include <string>

#include "sluice/stage.h"
#include "stage_impl.h"
#include "stage_stats.h"

namespace sluice {
namespace detail {

ShardAllocator& shard_allocator() {
  static auto* a = new ShardAllocator();  // never destroyed: threads may exit after main
  return *a;
}

// Reads only the shards some thread leased: in a process with a few
// threads, a few of the kShards (each fold of all of them read ~30 KB, and
// a collect folds every channel and object).
Folded StatsBlock::fold() const {
  Folded f;
  const unsigned extent = shard_allocator().extent.load(std::memory_order_acquire);
  for (unsigned k = 0; k < extent; ++k) {
    const Shard& s = shards_[k];
    for (std::size_t i = 0; i < s.origin.size(); ++i) {
      f.origin[i].ops += s.origin[i].ops.load(std::memory_order_relaxed);
      f.origin[i].bytes += s.origin[i].bytes.load(std::memory_order_relaxed);
    }
    for (std::size_t b = 0; b < s.wait.size(); ++b) {
      f.wait.buckets[b] += s.wait[b].load(std::memory_order_relaxed);
    }
    f.wait.total_ns += s.wait_total_ns.load(std::memory_order_relaxed);
    f.cancelled += s.cancelled.load(std::memory_order_relaxed);
    f.rejected += s.rejected.load(std::memory_order_relaxed);
  }
  return f;
}

// What happened since the previous call. Callers serialise (stage control mutex).
Folded StatsBlock::take_delta() {
  Folded now = fold();
  Folded d = now.minus(last_);
  last_ = now;
  return d;
}

}  // namespace detail

namespace {

void to_stats(const detail::Folded& d, Counters& total, std::map<std::string, Counters>& by_origin,
              WaitStats& wait) {
  total = {};
  for (int i = 0; i < detail::kOriginSlots; ++i) {
    const Counters& c = d.origin[static_cast<std::size_t>(i)];
    if (c.ops == 0 && c.bytes == 0) continue;
    total.add(c);
    std::string name = i < detail::kOriginSlots - 1
                           ? std::string(origin_name(static_cast<OriginId>(i)))
                           : std::string("more");
    by_origin[name].add(c);
  }
  wait = d.wait;
  std::uint64_t waited = 0;
  for (std::size_t b = 1; b < wait.buckets.size(); ++b) waited += wait.buckets[b];
  wait.buckets[0] = total.ops >= waited ? total.ops - waited : 0;
}

// Adds to `out` what the counters of removed channels and objects counted
// since the previous collect, under their names: to the channel (and object)
// of that name when the stage has one again, else to an entry of their own
// (an object's without state). Frees the ones nothing can count into any
// more.
void add_retired_locked(Stage::Impl& s, StageStats& out) SLUICE_REQUIRES(s.control_mu) {
  for (auto it = s.retired.begin(); it != s.retired.end();) {
    detail::Retired& r = *it;
    const bool last = r.block != nullptr && last_reference(r.block);
    detail::Folded d = r.rest;
    r.rest = {};
    if (r.block != nullptr) d.add(r.block->take_delta());
    if (last) r.block.reset();
    if (!d.empty()) {
      auto ch = std::find_if(out.channels.begin(), out.channels.end(),
                             [&](const ChannelStats& c) { return c.name == r.channel; });
      if (ch == out.channels.end()) {
        out.channels.emplace_back();
        ch = std::prev(out.channels.end());
        ch->name = r.channel;
      }
      Counters total;
      std::map<std::string, Counters> by_origin;
      WaitStats wait;
      to_stats(d, total, by_origin, wait);
      if (!r.object.empty()) {
        auto obj = std::find_if(ch->objects.begin(), ch->objects.end(),
                                [&](const ObjectStats& o) { return o.name == r.object; });
        if (obj == ch->objects.end()) {
          ch->objects.emplace_back();
          obj = std::prev(ch->objects.end());
          obj->name = r.object;
          obj->type = r.type;
        }
        obj->total.add(total);
        for (const auto& [n, v] : by_origin) obj->by_origin[n].add(v);
        obj->wait.add(wait);
        obj->cancelled += d.cancelled;
        obj->rejected += d.rejected;
      }
      ch->total.add(total);
      for (const auto& [n, v] : by_origin) ch->by_origin[n].add(v);
      ch->wait.add(wait);
      out.total.add(total);
    }
    it = r.block == nullptr ? s.retired.erase(it) : std::next(it);
  }
}

// Folds every block of the stage: deltas since the previous collect (which
// then start over), or totals since creation (which change nothing).
StageStats gather(Stage::Impl& s, bool deltas) {
  MutexLock lock(s.control_mu);
  auto take = [deltas](detail::StatsBlock& b) { return deltas ? b.take_delta() : b.fold(); };
  StageStats out;
  out.stage = s.name;
  out.collected_at_ns = now_of(s);
  out.interval_ns = out.collected_at_ns - (deltas ? s.last_collect_ns : s.created_ns);
  if (deltas) s.last_collect_ns = out.collected_at_ns;
  {
    std::map<std::string, Counters> ignored;
    WaitStats w;
    to_stats(take(*s.unclassified), out.unclassified, ignored, w);
  }
  out.total = out.unclassified;
  for (const auto& c : s.model.channels) {
    ChannelStats cs;
    cs.name = c.name;
    to_stats(take(*c.stats), cs.total, cs.by_origin, cs.wait);
    for (const auto& o : c.objects) {
      ObjectStats os;
      os.name = o.name;
      os.type = o.type;
      detail::Folded d = take(*o.mech->stats);
      to_stats(d, os.total, os.by_origin, os.wait);
      os.cancelled = d.cancelled;
      os.rejected = d.rejected;
      // Values the board brought since the object's last request are its
      // state too.
      detail::Feed& feed = o.mech->feed;
      feed.poll(*o.mech->object);
      os.state = o.mech->object->collect();
      if (feed.index >= 0 && os.state.is_object()) {
        os.state["board"] = {{"slot", feed.index},
                             {"taken", feed.taken.load(std::memory_order_relaxed)},
                             {"rejected", feed.rejected.load(std::memory_order_relaxed)}};
      }
      cs.total.add(os.total);
      for (const auto& [n, v] : os.by_origin) cs.by_origin[n].add(v);
      cs.wait.add(os.wait);
      cs.objects.push_back(std::move(os));
    }
    out.total.add(cs.total);
    out.channels.push_back(std::move(cs));
  }
  if (deltas) add_retired_locked(s, out);
  for (ChannelStats& cs : out.channels) {
    std::uint64_t waited = 0;
    for (std::size_t b = 1; b < cs.wait.buckets.size(); ++b) waited += cs.wait.buckets[b];
    cs.wait.buckets[0] = cs.total.ops >= waited ? cs.total.ops - waited : 0;
  }
  return out;
}

}  // namespace

StageStats Stage::collect() {
  return gather(*impl_, /*deltas=*/true);
}
StageStats Stage::totals() const {
  return gather(*impl_, /*deltas=*/false);
}

StageInfo Stage::info() const {
  const Impl& s = *impl_;
  MutexLock lock(s.control_mu);
  StageInfo info;
  info.name = s.name;
  info.pid = s.pid;
  info.labels = s.labels;
  info.classifiers = detail::classifier_names(s.model.classifiers);
  info.rules_version = s.rules_version;
  for (const auto& c : s.model.channels) {
    ChannelInfo ci;
    ci.name = c.name;
    ci.classifiers = detail::classifier_names(c.classifiers);
    ci.match = nlohmann::json::array();
    for (const auto& m : c.matches) ci.match.push_back(m.source);
    ci.is_default = c.is_default;
    for (const auto& o : c.objects) {
      ObjectInfo oi;
      oi.name = o.name;
      oi.type = o.type;
      oi.match = nlohmann::json::array();
      for (const auto& m : o.matches) oi.match.push_back(m.source);
      oi.is_default = o.is_default;
      if (o.mech->feed.index >= 0) {
        oi.board_slot = o.mech->feed.index;
        oi.board_tag = o.mech->feed.tag;
        for (std::string_view t : o.mech->object->tunables()) oi.tunables.emplace_back(t);
      }
      ci.objects.push_back(std::move(oi));
    }
    info.channels.push_back(std::move(ci));
  }
  return info;
}

std::shared_ptr<EnforcementObject> Stage::object(std::string_view channel,
                                                 std::string_view object) const {
  const Impl& s = *impl_;
  MutexLock lock(s.control_mu);
  for (const auto& c : s.model.channels) {
    if (c.name != channel) continue;
    for (const auto& o : c.objects) {
      if (o.name == object) return {o.mech, o.mech->object.get()};
    }
  }
  return nullptr;
}

}  // namespace sluice
