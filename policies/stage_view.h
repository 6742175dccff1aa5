// Reading what the daemon collected of a stage (a StageView: its labels, its
// description and its statistics since the previous step), shared by the
// policies in this folder; internal to sluice::policies.
//
// Thread safety: pure functions of the values passed in.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "sluice/policy.h"

namespace sluice::stage_view {

// Every label in `want` is in `have` with the same value (an empty `want`
// matches any stage).
bool labels_match(const std::map<std::string, std::string>& want,
                  const std::map<std::string, std::string>& have);

// A channel and an object by name in the statistics; null when absent.
const ChannelStats* find_channel(const StageStats& stats, std::string_view channel);
const ObjectStats* find_object(const ChannelStats* channel, std::string_view object);
const ObjectStats* find_object(const StageStats& stats, std::string_view channel,
                               std::string_view object);

// A channel by name in the description; null when absent.
const ChannelInfo* find_channel(const StageInfo& info, std::string_view channel);
bool has_object(const StageInfo& info, std::string_view channel, std::string_view object);

// A number of an object's collected state (a drl's "rate" or "waiters"); 0
// when the object, the field or a number is not there.
double state_number(const ObjectStats* object, const char* field);

// The time the statistics cover: the stage's own measure of its interval,
// else the loop's configured interval.
std::int64_t interval_ns(const StageView& stage, const PolicyInput& input);

// A DRL rate for `bytes_per_s`: rounded to an integer, at least 1.
std::int64_t to_rate(double bytes_per_s);

}  // namespace sluice::stage_view
