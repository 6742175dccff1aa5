// Building a routing snapshot from a stage's model (snapshot.h).
#include "snapshot.h"

#include <string>
#include <vector>

#include "sluice/dcheck.h"
#include "sluice/wire.h"

namespace sluice::detail {
namespace {

constexpr std::size_t kMaxKeysPerMatch = 65536;

Key pack(std::uint64_t workflow, std::uint64_t tenant, std::uint64_t origin, std::uint64_t op,
         std::uint64_t size_class, std::uint64_t level) {
  Key k;
  k.w[0] = workflow;
  k.w[1] = tenant | (origin << 32) | (op << 48) | (level << 56);
  k.w[2] = size_class;
  return k;
}

// Every key a match denotes (the product of its value lists), in `set`'s layout.
StatusOr<std::vector<Key>> expand(const MatchSpec& m, ClassifierSet set, const std::string& owner,
                                  const std::string& selector) {
  // A classifier the match names but the rule does not select is the likelier
  // mistake (a stale match), so it is reported first.
  for (int i = 0; i < kClassifierCount; ++i) {
    unsigned bit = 1u << i;
    if (!(set & bit) && (m.given & bit)) {
      return Status::invalid(owner + ": match " + wire::echo(m.source) + " names classifier '" +
                             std::string(classifier_name(static_cast<Classifier>(i))) +
                             "', which " + selector + " does not select");
    }
  }
  for (int i = 0; i < kClassifierCount; ++i) {
    unsigned bit = 1u << i;
    if ((set & bit) && !(m.given & bit)) {
      return Status::invalid(owner + ": match " + wire::echo(m.source) +
                             " does not name classifier '" +
                             std::string(classifier_name(static_cast<Classifier>(i))) +
                             "', which " + selector + " selects");
    }
  }
  std::array<std::vector<std::uint64_t>, kClassifierCount> v = m.values;
  for (auto& list : v) {
    if (list.empty()) list.push_back(0);
  }
  std::size_t total = 1;
  for (const auto& list : v) {
    total *= list.size();
    if (total > kMaxKeysPerMatch) {
      return Status::invalid(owner + ": match " + wire::echo(m.source) + " expands to more than " +
                             std::to_string(kMaxKeysPerMatch) + " combinations");
    }
  }
  std::vector<Key> keys;
  keys.reserve(total);
  auto at = [&](Classifier c, std::size_t i) { return v[static_cast<std::size_t>(c)][i]; };
  auto n = [&](Classifier c) { return v[static_cast<std::size_t>(c)].size(); };
  for (std::size_t a = 0; a < n(Classifier::kWorkflow); ++a)
    for (std::size_t b = 0; b < n(Classifier::kOperation); ++b)
      for (std::size_t c = 0; c < n(Classifier::kSizeClass); ++c)
        for (std::size_t d = 0; d < n(Classifier::kOrigin); ++d)
          for (std::size_t e = 0; e < n(Classifier::kTenant); ++e)
            for (std::size_t f = 0; f < n(Classifier::kLevel); ++f)
              keys.push_back(pack(at(Classifier::kWorkflow, a), at(Classifier::kTenant, e),
                                  at(Classifier::kOrigin, d), at(Classifier::kOperation, b),
                                  at(Classifier::kSizeClass, c), at(Classifier::kLevel, f)));
  return keys;
}

std::atomic<std::uint64_t> g_next_version{1};

bool same(const Target& a, const Target& b) noexcept {
  return a.object == b.object && a.stats == b.stats && a.feed == b.feed;
}

// The target the model's object `o` gets: its object unless it passes every
// request through, its counters, and its feed when it has tunables.
bool targets_object(const Target& t, const ObjectEntry& o) noexcept {
  const Mechanism& m = *o.mech;
  if (t.stats != m.stats.get()) return false;
  if (m.object->passes_through()) return t.object == nullptr && t.feed == nullptr;
  return t.object == m.object.get() && t.feed == (m.object->tunables().empty() ? nullptr : &m.feed);
}

// What a snapshot built from `m` promises beyond Snapshot::well_formed(), which
// sees the snapshot alone: that it is the model's, and holds what it points
// into. Checked in debug builds, not evaluated otherwise.
void check_built(const Snapshot& s, const Model& m, std::size_t objects) {
  SLUICE_DCHECK(s.refs.load(std::memory_order_relaxed) == 1,
                "a new snapshot carries one reference, the caller's");
  SLUICE_DCHECK(s.version != 0, "a snapshot's version is never 0 (an empty cache entry's)");
  SLUICE_DCHECK(s.routes.size() == m.channels.size(), "a route per channel of the model");
  SLUICE_DCHECK(s.fallback < 0 || m.channels[static_cast<std::size_t>(s.fallback)].is_default,
                "the fallback channel is the one the model marks default");
  SLUICE_DCHECK(s.unclassified.object == nullptr && s.unclassified.feed == nullptr,
                "unclassified requests call no object");
  SLUICE_DCHECK(s.owned.size() == 1 + s.routes.size() + objects,
                "the snapshot owns every mechanism and block it points into");
  for (std::size_t ci = 0; ci < s.routes.size(); ++ci) {
    const ChannelRoute& r = s.routes[ci];
    const ChannelEntry& c = m.channels[ci];
    SLUICE_DCHECK(r.own == c.stats.get(), "a route counts into its channel's block");
    SLUICE_DCHECK(r.own->snapshots.load(std::memory_order_relaxed) > 0,
                  "the snapshot is among the holders of its channels' blocks");
    SLUICE_DCHECK(r.objects.size() == c.objects.size(), "a route has a target per object");
    std::size_t first = 0;  // the channel's default object, else its first
    for (std::size_t oi = 0; oi < r.objects.size(); ++oi) {
      SLUICE_DCHECK(targets_object(r.objects[oi], c.objects[oi]),
                    "an object's target is its object (unless it passes everything through), "
                    "its counters and its feed");
      SLUICE_DCHECK(r.objects[oi].stats->snapshots.load(std::memory_order_relaxed) > 0,
                    "the snapshot is among the holders of its objects' blocks");
      if (c.objects[oi].is_default) first = oi;
    }
    SLUICE_DCHECK(r.objects.empty() ? same(r.fallback, Target{nullptr, r.own, nullptr})
                                    : same(r.fallback, r.objects[first]),
                  "a channel's fallback is its default object, else its first, else its own "
                  "counters");
  }
}

}  // namespace

KeyMask mask_of(ClassifierSet set) {
  KeyMask m;
  auto has = [&](Classifier c) { return (set & (1u << static_cast<unsigned>(c))) != 0; };
  if (has(Classifier::kWorkflow)) m.w[0] = ~std::uint64_t{0};
  if (has(Classifier::kTenant)) m.w[1] |= 0xFFFF'FFFFull;
  if (has(Classifier::kOrigin)) m.w[1] |= kOriginBits;
  if (has(Classifier::kOperation)) m.w[1] |= 0xFFull << 48;
  if (has(Classifier::kLevel)) m.w[1] |= 0xFFull << 56;
  if (has(Classifier::kSizeClass)) m.w[2] = 0xFF;
  return m;
}

StatusOr<Snapshot*> build_snapshot(const Model& m, std::uint64_t version,
                                   const std::shared_ptr<StatsBlock>& unclassified) {
  auto s = std::make_unique<Snapshot>();
  s->version = version;
  s->mask = mask_of(m.classifiers);
  s->memo_mask = s->mask;
  s->unclassified = {nullptr, unclassified.get()};
  std::size_t objects = 0;
  for (const ChannelEntry& c : m.channels) objects += c.objects.size();
  s->routes.reserve(m.channels.size());
  s->owned.reserve(1 + m.channels.size() + objects);
  s->owned.push_back(unclassified);
  for (std::size_t ci = 0; ci < m.channels.size(); ++ci) {
    const ChannelEntry& c = m.channels[ci];
    // Error messages only: built when there is a match to check.
    auto owner = [&c] { return "channel '" + c.name + "'"; };
    if (c.is_default) {
      if (s->fallback >= 0) {
        return Status::invalid("channels '" +
                               m.channels[static_cast<std::size_t>(s->fallback)].name + "' and '" +
                               c.name + "' are both marked default");
      }
      s->fallback = static_cast<int>(ci);
    }
    for (const MatchSpec& match : c.matches) {
      auto keys = expand(match, m.classifiers, owner(), "the stage's differentiate rule");
      if (!keys.is_ok()) return keys.status();
      for (const Key& k : keys.value()) {
        int prev = s->table.insert(k, static_cast<int>(ci));
        if (prev >= 0 && prev != static_cast<int>(ci)) {
          return Status::invalid(owner() + ": match " + wire::echo(match.source) +
                                 " overlaps a match of channel '" +
                                 m.channels[static_cast<std::size_t>(prev)].name + "'");
        }
      }
    }
    ChannelRoute r;
    r.own = c.stats.get();
    r.mask = mask_of(c.classifiers);
    r.objects.reserve(c.objects.size());
    for (std::size_t w = 0; w < 3; ++w) s->memo_mask.w[w] |= r.mask.w[w];
    s->owned.push_back(c.stats);
    r.fallback = {nullptr, c.stats.get()};
    int default_object = -1;
    for (std::size_t oi = 0; oi < c.objects.size(); ++oi) {
      const ObjectEntry& o = c.objects[oi];
      EnforcementObject* obj = o.mech->object.get();
      if (obj->passes_through()) {
        r.objects.push_back({nullptr, o.mech->stats.get(), nullptr});
      } else {
        r.objects.push_back(
            {obj, o.mech->stats.get(), obj->tunables().empty() ? nullptr : &o.mech->feed});
      }
      s->owned.push_back(o.mech);
      if (obj->holds_capacity()) s->holders.push_back(o.mech);
      auto oowner = [&c, &o] { return "object '" + c.name + "/" + o.name + "'"; };
      if (o.is_default) {
        if (default_object >= 0) {
          return Status::invalid(owner() + ": objects '" +
                                 c.objects[static_cast<std::size_t>(default_object)].name +
                                 "' and '" + o.name + "' are both marked default");
        }
        default_object = static_cast<int>(oi);
      }
      for (const MatchSpec& match : o.matches) {
        auto keys = expand(match, c.classifiers, oowner(), "the channel's differentiate rule");
        if (!keys.is_ok()) return keys.status();
        for (const Key& k : keys.value()) {
          int prev = r.table.insert(k, static_cast<int>(oi));
          if (prev >= 0 && prev != static_cast<int>(oi)) {
            return Status::invalid(oowner() + ": match " + wire::echo(match.source) +
                                   " overlaps a match of object '" +
                                   c.objects[static_cast<std::size_t>(prev)].name + "'");
          }
        }
      }
    }
    if (!r.objects.empty())
      r.fallback = r.objects[default_object >= 0 ? static_cast<std::size_t>(default_object) : 0];
    s->routes.push_back(std::move(r));
    s->routes.back().hold();
  }
  SLUICE_DCHECK(s->well_formed(), "a snapshot's routes name channels and objects it holds");
  check_built(*s, m, objects);
  return s.release();
}

std::uint64_t next_version() noexcept {
  return g_next_version.fetch_add(1);
}

}  // namespace sluice::detail
