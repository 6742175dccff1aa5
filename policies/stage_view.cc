// Reading a stage's description and statistics; see stage_view.h.
#include "stage_view.h"

#include <algorithm>
#include <cmath>

namespace sluice::stage_view {

bool labels_match(const std::map<std::string, std::string>& want,
                  const std::map<std::string, std::string>& have) {
  for (const auto& [k, v] : want) {
    auto it = have.find(k);
    if (it == have.end() || it->second != v) return false;
  }
  return true;
}

const ChannelStats* find_channel(const StageStats& stats, std::string_view channel) {
  for (const auto& c : stats.channels) {
    if (c.name == channel) return &c;
  }
  return nullptr;
}

const ObjectStats* find_object(const ChannelStats* channel, std::string_view object) {
  if (channel == nullptr) return nullptr;
  for (const auto& o : channel->objects) {
    if (o.name == object) return &o;
  }
  return nullptr;
}

const ObjectStats* find_object(const StageStats& stats, std::string_view channel,
                               std::string_view object) {
  return find_object(find_channel(stats, channel), object);
}

const ChannelInfo* find_channel(const StageInfo& info, std::string_view channel) {
  for (const auto& c : info.channels) {
    if (c.name == channel) return &c;
  }
  return nullptr;
}

bool has_object(const StageInfo& info, std::string_view channel, std::string_view object) {
  const ChannelInfo* c = find_channel(info, channel);
  if (c == nullptr) return false;
  return std::any_of(c->objects.begin(), c->objects.end(),
                     [&](const ObjectInfo& o) { return o.name == object; });
}

double state_number(const ObjectStats* object, const char* field) {
  if (object == nullptr || !object->state.is_object()) return 0;
  auto it = object->state.find(field);
  return (it != object->state.end() && it->is_number()) ? it->get<double>() : 0;
}

std::int64_t interval_ns(const StageView& stage, const PolicyInput& input) {
  return stage.stats.interval_ns > 0 ? stage.stats.interval_ns : input.interval_ns;
}

std::int64_t to_rate(double bytes_per_s) {
  return std::max<std::int64_t>(1, std::llround(bytes_per_s));
}

}  // namespace sluice::stage_view
