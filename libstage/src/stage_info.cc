// A stage's description (StageInfo) in its JSON form, both ways, and the rule
// for stage names: what a stage sends in its hello and collect answers, and
// what the daemon reads back from them.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sluice/board.h"
#include "sluice/stage.h"

namespace sluice {

using nlohmann::json;

bool valid_stage_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > kMaxStageNameLength) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == ':' || c == '@' || c == '+' || c == '-';
    if (!ok) return false;
  }
  return true;
}

void to_json(json& j, const StageInfo& s) {
  json channels = json::array();
  for (const auto& c : s.channels) {
    json objects = json::array();
    for (const auto& o : c.objects) {
      json obj = {
          {"name", o.name}, {"type", o.type}, {"match", o.match}, {"default", o.is_default}};
      if (o.board_slot >= 0) {
        obj["board"] = {{"slot", o.board_slot}, {"tag", o.board_tag}, {"tunables", o.tunables}};
      }
      objects.push_back(std::move(obj));
    }
    channels.push_back({{"name", c.name},
                        {"classifiers", c.classifiers},
                        {"match", c.match},
                        {"default", c.is_default},
                        {"objects", objects}});
  }
  j = {{"name", s.name},
       {"pid", s.pid},
       {"labels", s.labels},
       {"classifiers", s.classifiers},
       {"rules_version", s.rules_version},
       {"channels", channels}};
}

namespace {

std::vector<std::string> string_list(const json& j) {
  std::vector<std::string> out;
  if (j.is_array()) {
    for (auto& e : j) {
      if (e.is_string()) out.push_back(e.get<std::string>());
    }
  }
  return out;
}

// A JSON integer >= 0 (parsed from text it is unsigned; built in memory, as
// tests and in-process callers do, it may be signed).
bool count_of(const json& j, std::uint64_t& out) {
  if (j.is_number_unsigned()) {
    out = j.get<std::uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<std::int64_t>() >= 0) {
    out = static_cast<std::uint64_t>(j.get<std::int64_t>());
    return true;
  }
  return false;
}

bool flag_default(const json& j) {
  for (const char* k : {"default", "is_default"}) {
    auto it = j.find(k);
    if (it != j.end() && it->is_boolean()) return it->get<bool>();
  }
  return false;
}

// An object's board binding: only a well-formed one counts; anything else
// leaves the object without one (a control plane then sends it messages only).
void take_board_binding(const json& b, ObjectInfo& oi) {
  if (!b.is_object()) return;
  auto slot = b.find("slot");
  auto tag = b.find("tag");
  auto tunables = b.find("tunables");
  std::uint64_t slot_index = 0, tag_value = 0;
  if (slot != b.end() && count_of(*slot, slot_index) && slot_index < kBoardSlots &&
      tag != b.end() && count_of(*tag, tag_value) && tunables != b.end() && tunables->is_array() &&
      tunables->size() <= kMaxTunables) {
    oi.board_slot = static_cast<int>(slot_index);
    oi.board_tag = tag_value;
    oi.tunables = string_list(*tunables);
    if (oi.tunables.size() != tunables->size()) oi.board_slot = -1;
  }
}

}  // namespace

StatusOr<StageInfo> stage_info_from_json(const json& j) {
  if (!j.is_object()) return Status::invalid("info: expected an object");
  StageInfo s;
  try {
    s.name = j.value("name", std::string());
    s.pid = j.value("pid", std::int64_t{0});
    if (auto it = j.find("labels"); it != j.end() && it->is_object()) {
      for (auto& [k, v] : it->items()) {
        if (v.is_string()) s.labels[k] = v.get<std::string>();
      }
    }
    if (auto it = j.find("classifiers"); it != j.end()) s.classifiers = string_list(*it);
    s.rules_version = j.value("rules_version", std::uint64_t{0});
    if (auto it = j.find("channels"); it != j.end()) {
      if (!it->is_array()) return Status::invalid("info.channels: expected an array");
      for (auto& c : *it) {
        if (!c.is_object()) return Status::invalid("info.channels[]: expected objects");
        ChannelInfo ch;
        ch.name = c.value("name", std::string());
        if (auto cl = c.find("classifiers"); cl != c.end()) ch.classifiers = string_list(*cl);
        ch.match = c.value("match", json());
        ch.is_default = flag_default(c);
        if (auto objs = c.find("objects"); objs != c.end() && objs->is_array()) {
          for (auto& o : *objs) {
            if (!o.is_object()) continue;
            ObjectInfo oi;
            oi.name = o.value("name", std::string());
            oi.type = o.value("type", std::string());
            oi.match = o.value("match", json());
            oi.is_default = flag_default(o);
            if (auto b = o.find("board"); b != o.end()) take_board_binding(*b, oi);
            ch.objects.push_back(std::move(oi));
          }
        }
        s.channels.push_back(std::move(ch));
      }
    }
  } catch (const json::exception& e) {
    return Status::invalid(std::string("info: ") + e.what());
  }
  return s;
}

}  // namespace sluice
