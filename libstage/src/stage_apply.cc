// Applying rules to a stage (Stage::apply and its forms): a batch is applied
// to a copy of the model and published as one new snapshot, or, when it only
// configures objects, applied to them in place. See sluice/stage.h.
#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "rules.h"
#include "sluice/json_text.h"
#include "sluice/stage.h"
#include "stage_impl.h"

namespace sluice {
namespace {

// Applies one parsed rule to the model copy.
struct Pending {
  std::vector<std::shared_ptr<detail::Mechanism>> removed;
  std::vector<std::shared_ptr<detail::Mechanism>> created;
  // The configs live in the parsed rules, which outlive the Pending.
  std::vector<std::pair<EnforcementObject*, const nlohmann::json*>> configures;
  // Counters of the channels and objects this batch removed, by name
  // (`object` empty for a channel's own), for the ones it creates again under
  // the same name.
  struct Freed {
    std::string channel;
    std::string object;
    std::shared_ptr<detail::StatsBlock> block;
    std::string type;  // the object's
  };
  std::vector<Freed> freed;
  // Channels plus objects in the model being built (see kMaxEntries).
  std::size_t entries = 0;
  // The batch's last lease rule, in force once the batch is.
  const detail::Rule* lease = nullptr;

  // Takes note of a channel the batch removes: its objects are shut down
  // once the batch is in, and its counters may go to one created again
  // under its name.
  void remove_channel(const detail::ChannelEntry& c) {
    for (const auto& o : c.objects) remove_object(c.name, o);
    freed.push_back({c.name, {}, c.stats, {}});
    --entries;
  }
  void remove_object(const std::string& channel, const detail::ObjectEntry& o) {
    removed.push_back(o.mech);
    freed.push_back({channel, o.name, o.mech->stats, o.type});
    --entries;
  }
  // The counters a channel or object created as `channel`/`object` (empty
  // for a channel) starts with: those of the one of that name this batch
  // removed, else new ones. Reusing them keeps collect's deltas whole across
  // the swap (a static policy with `replace` swaps every channel on each
  // update), counts what threads still holding the old snapshot record, and
  // spares the stage allocating and zeroing a block of kShards shards per
  // channel and object.
  std::shared_ptr<detail::StatsBlock> stats_for(std::string_view channel,
                                                std::string_view object = {}) {
    for (auto it = freed.begin(); it != freed.end(); ++it) {
      if (it->channel == channel && it->object == object) {
        auto block = std::move(it->block);
        freed.erase(it);
        return block;
      }
    }
    return std::make_shared<detail::StatsBlock>();
  }
};

Status too_many_entries() {
  return Status::invalid("a stage holds at most " + std::to_string(detail::kMaxEntries) +
                         " channels and objects together");
}

// Channel `name` of `m`, or the error naming it.
StatusOr<detail::ChannelEntry*> channel_in(detail::Model& m, const std::string& name) {
  detail::ChannelEntry* c = m.find(name);
  if (c == nullptr) return Status::not_found("channel '" + name + "' does not exist");
  return c;
}

// Object `object` of channel `channel` in `m`, or the error naming what is missing.
StatusOr<detail::ObjectEntry*> object_in(detail::Model& m, const std::string& channel,
                                         const std::string& object) {
  auto c = channel_in(m, channel);
  if (!c.is_ok()) return c.status();
  detail::ObjectEntry* o = (*c)->find(object);
  if (o == nullptr) {
    return Status::not_found("object '" + object + "' does not exist in channel '" + channel + "'");
  }
  return o;
}

// A configure rule's object in `m`, its config checked as configure would.
StatusOr<EnforcementObject*> configure_target(detail::Model& m, const detail::Rule& r) {
  auto o = object_in(m, r.channel, r.object);
  if (!o.is_ok()) return o.status();
  Status v = (*o)->mech->object->validate(r.config);
  if (!v.is_ok()) return v.with_prefix("config.");
  return (*o)->mech->object.get();
}

Status apply_rule(Stage::Impl& s, detail::Model& m, const detail::Rule& r, Pending& p) {
  using K = detail::Rule::Kind;
  auto channel = [&] { return channel_in(m, r.channel); };
  switch (r.kind) {
    case K::kCreateChannel: {
      if (m.find(r.channel) != nullptr) {
        return Status::exists("channel '" + r.channel + "' already exists");
      }
      if (p.entries >= detail::kMaxEntries) return too_many_entries();
      detail::ChannelEntry c;
      c.name = r.channel;
      c.stats = p.stats_for(r.channel);
      c.classifiers = r.classifiers;
      c.is_default = r.is_default;
      if (r.match) c.matches.push_back(*r.match);
      m.channels.push_back(std::move(c));
      ++p.entries;
      return {};
    }
    case K::kRemoveChannel: {
      auto it = std::find_if(m.channels.begin(), m.channels.end(),
                             [&](const auto& c) { return c.name == r.channel; });
      if (it == m.channels.end())
        return Status::not_found("channel '" + r.channel + "' does not exist");
      p.remove_channel(*it);
      m.channels.erase(it);
      return {};
    }
    case K::kCreateObject: {
      auto c = channel();
      if (!c.is_ok()) return c.status();
      if ((*c)->find(r.object) != nullptr) {
        return Status::exists("object '" + r.object + "' already exists in channel '" + r.channel +
                              "'");
      }
      if (p.entries >= detail::kMaxEntries) return too_many_entries();
      if (!s.registry->contains(r.type)) {
        return Status::invalid("type: " + s.registry->unknown_type(r.type));
      }
      auto obj = s.registry->create(r.type, r.config, ObjectEnv{s.clock});
      if (!obj.is_ok()) return obj.status().with_prefix("config.");
      detail::ObjectEntry e;
      e.name = r.object;
      e.type = r.type;
      e.mech = std::make_shared<detail::Mechanism>();
      e.mech->object = std::move(obj).value();
      e.mech->stats = p.stats_for(r.channel, r.object);
      e.is_default = r.is_default;
      if (r.match) e.matches.push_back(*r.match);
      p.created.push_back(e.mech);
      (*c)->objects.push_back(std::move(e));
      ++p.entries;
      return {};
    }
    case K::kRemoveObject: {
      auto c = channel();
      if (!c.is_ok()) return c.status();
      auto& objs = (*c)->objects;
      auto it =
          std::find_if(objs.begin(), objs.end(), [&](const auto& o) { return o.name == r.object; });
      if (it == objs.end()) {
        return Status::not_found("object '" + r.object + "' does not exist in channel '" +
                                 r.channel + "'");
      }
      p.remove_object(r.channel, *it);
      objs.erase(it);
      return {};
    }
    case K::kDifferentiate: {
      if (r.channel.empty()) {
        m.classifiers = r.classifiers;
        return {};
      }
      auto c = channel();
      if (!c.is_ok()) return c.status();
      (*c)->classifiers = r.classifiers;
      return {};
    }
    case K::kRoute: {
      if (!r.object.empty()) {
        auto o = object_in(m, r.channel, r.object);
        if (!o.is_ok()) return o.status();
        (*o)->matches.push_back(*r.match);
        return {};
      }
      auto c = channel();
      if (!c.is_ok()) return c.status();
      (*c)->matches.push_back(*r.match);
      return {};
    }
    case K::kConfigure: {
      auto o = configure_target(m, r);
      if (!o.is_ok()) return o.status();
      p.configures.emplace_back(*o, &r.config);
      return {};
    }
    case K::kLease: {
      // Its fallback must apply to the model as this batch leaves it so far.
      for (std::size_t i = 0; i < r.fallback->size(); ++i) {
        auto o = configure_target(m, (*r.fallback)[i]);
        if (!o.is_ok()) return o.status().with_prefix("fallback[" + std::to_string(i) + "]: ");
      }
      p.lease = &r;
      return {};
    }
  }
  return Status::internal("unhandled rule");
}

// Keeps the counters a batch removed, and did not hand to a channel or object
// it created again under the same name, for the next collect
// (detail::Retired). Blocks no snapshot holds any more are folded into a
// small remainder and freed, one remainder per name, so that a stage nobody
// collects does not keep a block per removal.
void retire_locked(Stage::Impl& s, Pending& p) SLUICE_REQUIRES(s.control_mu) {
  for (auto& f : p.freed) {
    s.retired.push_back(
        {std::move(f.channel), std::move(f.object), std::move(f.type), std::move(f.block), {}});
  }
  p.freed.clear();
  for (std::size_t i = 0; i < s.retired.size();) {
    detail::Retired& r = s.retired[i];
    if (r.block != nullptr && last_reference(r.block)) {
      r.rest.add(r.block->take_delta());
      r.block.reset();
    }
    if (r.block == nullptr) {
      auto same = std::find_if(s.retired.begin(), s.retired.begin() + static_cast<long>(i),
                               [&](const detail::Retired& o) {
                                 return o.block == nullptr && o.channel == r.channel &&
                                        o.object == r.object;
                               });
      if (same != s.retired.begin() + static_cast<long>(i)) {
        same->rest.add(r.rest);
        s.retired.erase(s.retired.begin() + static_cast<long>(i));
        continue;
      }
    }
    ++i;
  }
}

// Applies a parsed batch to the stage (see Stage::apply).
Status apply_parsed_locked(Stage::Impl& s, std::span<const detail::Rule> list)
    SLUICE_REQUIRES(s.control_mu) {
  if (s.shut_down) return Status::precondition("stage '" + s.name + "' is shut down");
  // A batch of configure rules only (what control loops send every cycle)
  // leaves routing alone: the rules are checked against the current model,
  // the objects reconfigured in place, and no snapshot is built or published,
  // so threads keep their cached snapshots and memos. Any other batch works
  // on a copy: descriptions are copied, mechanisms shared, and a failing
  // batch leaves the published model untouched.
  const bool configure_only = std::all_of(list.begin(), list.end(), [](const detail::Rule& r) {
    return r.kind == detail::Rule::Kind::kConfigure || r.kind == detail::Rule::Kind::kLease;
  });
  detail::Model copy;
  Pending p;
  std::size_t i = 0;
  if (!configure_only) {
    p.entries = s.entries;
    // A replacing batch (the static policy's) starts by removing channels:
    // those removals are applied while copying, so the channels they remove
    // are never copied. A removal that would fail stops this; the loop below
    // then reports it as it reports any rule.
    std::vector<bool> drop(s.model.channels.size());
    for (; i < list.size() && list[i].kind == detail::Rule::Kind::kRemoveChannel; ++i) {
      std::size_t c = 0;
      while (c < drop.size() && (drop[c] || s.model.channels[c].name != list[i].channel)) ++c;
      if (c == drop.size()) break;
      drop[c] = true;
      p.remove_channel(s.model.channels[c]);
    }
    copy.classifiers = s.model.classifiers;
    copy.channels.reserve(s.model.channels.size());
    for (std::size_t c = 0; c < drop.size(); ++c) {
      if (drop[c]) continue;
      copy.channels.push_back(s.model.channels[c]);
    }
  }
  detail::Model& m = configure_only ? s.model : copy;  // configure changes no description
  for (; i < list.size(); ++i) {
    Status st = apply_rule(s, m, list[i], p);
    if (!st.is_ok()) return st.with_prefix("rules[" + std::to_string(i) + "]: ");
  }
  detail::Snapshot* snap = nullptr;
  if (!configure_only) {
    auto built = detail::build_snapshot(m, detail::next_version(), s.unclassified);
    if (!built.is_ok()) return built.status();
    snap = built.value();
  }
  for (auto& [object, config] : p.configures) {
    Status st = object->configure(*config);
    if (!st.is_ok()) {
      if (snap != nullptr) snap->unref();
      return st.with_prefix("config.");
    }
  }
  ++s.rules_version;
  if (p.lease != nullptr) {
    s.lease_deadline_ns =
        s.clock->now_ns() + static_cast<std::int64_t>(p.lease->lease_ms) * 1'000'000;
    s.lease_fallback = p.lease->fallback;
  }
  if (snap != nullptr) {
    // New objects get their board slots before the snapshot that routes to
    // them is published (a thread's shortcut reads an object's slot once,
    // when it arms), and before removed objects free theirs: one created and
    // removed in the batch frees its own.
    if (s.board) {
      for (auto& mech : p.created) s.give_slot_locked(*mech);
    }
    s.model = std::move(copy);
    s.entries = p.entries;
    s.publish_locked(snap);
    retire_locked(s, p);
  }
  if (s.board) {
    for (auto& mech : p.removed) mech->feed.unassign(*s.board);
  }
  for (auto& mech : p.removed) mech->object->shutdown();
  return {};
}

Status apply_parsed(Stage::Impl& s, std::span<const detail::Rule> list) {
  MutexLock lock(s.control_mu);
  return apply_parsed_locked(s, list);
}

}  // namespace

std::optional<std::chrono::nanoseconds> Stage::lease_left() const {
  MutexLock lock(impl_->control_mu);
  if (impl_->lease_deadline_ns == 0) return std::nullopt;
  return std::chrono::nanoseconds(
      std::max<std::int64_t>(0, impl_->lease_deadline_ns - impl_->clock->now_ns()));
}

bool Stage::expire_lease() noexcept {
  Impl& s = *impl_;
  MutexLock lock(s.control_mu);
  if (s.lease_deadline_ns == 0 || s.clock->now_ns() < s.lease_deadline_ns) return false;
  const auto fallback = std::move(s.lease_fallback);
  s.lease_deadline_ns = 0;
  ++s.leases_expired;
  // Rule by rule: an object removed since the lease was taken leaves the others' values
  // falling back all the same.
  if (fallback != nullptr) {
    for (const detail::Rule& r : *fallback) (void)apply_parsed_locked(s, {&r, 1});
  }
  return true;
}

std::uint64_t Stage::leases_expired() const {
  MutexLock lock(impl_->control_mu);
  return impl_->leases_expired;
}

Status Stage::check_rules(const nlohmann::json& batch) {
  return detail::parse_rules(batch).status();
}

Status Stage::apply(const nlohmann::json& rules) {
  auto parsed = detail::parse_rules(rules);
  if (!parsed.is_ok()) return parsed.status();
  return apply_parsed(*impl_, parsed.value());
}

Status Stage::apply_text(std::string_view text) {
  auto j = parse_json_text(text);
  if (!j.is_ok()) return j.status();
  return apply(j.value());
}

}  // namespace sluice
