// Fuzzes message validation and what a stage does with a valid message: the
// path ControlClient takes (parse, then apply rules / collect), and the typed
// reading of the control loop's two messages, rules and their acks, which
// must agree with the parsed body.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "sluice/objects/builtin.h"
#include "sluice/stage.h"
#include "sluice/wire.h"

namespace wire = sluice::wire;
using nlohmann::json;

namespace {

sluice::Stage& stage() {
  static std::unique_ptr<sluice::Stage> s = [] {
    sluice::objects::register_builtin();
    // Simulated time: a rules message may set any rate, and a request under
    // a slow one would otherwise wait for real (for days).
    static sluice::SimClock clock;
    sluice::StageOptions o;
    o.clock = &clock;
    auto st = sluice::Stage::create(o);
    if (!st) __builtin_trap();
    (void)(*st)->apply_text(R"([{"rule": "create_channel", "channel": "c", "default": true},
      {"rule": "create_object", "channel": "c", "object": "o", "type": "noop"}])");
    return std::move(*st);
  }();
  return *s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view payload(reinterpret_cast<const char*>(data), size);
  std::uint64_t id = 0;
  auto m = wire::parse_message(payload, &id);
  if (m) {
    // The typed readers answer for their own kind only, with the body's values.
    const auto rules = wire::read_rules(*m);
    if (rules.has_value() != (m->type == wire::Type::kRules)) __builtin_trap();
    if (rules && (rules->id != m->id || rules->rules != &m->body.at("rules") ||
                  !(rules->rules->is_array() || rules->rules->is_object()))) {
      __builtin_trap();
    }
    if (rules && rules->decided_ns != 0 && m->body["decided_ns"] != json(rules->decided_ns)) {
      __builtin_trap();
    }
    if (auto ack = wire::read_rules_ack(*m)) {
      if (m->type != wire::Type::kAck || ack->id != m->id ||
          m->body["rules_version"] != json(ack->rules_version)) {
        __builtin_trap();
      }
    }
  }
  if (!m) {
    std::string out;
    (void)wire::append_frame(wire::make_error(id, m.status()), out);
    return 0;
  }
  switch (m->type) {
    case wire::Type::kRules: {
      sluice::Status s = stage().apply(m->body.at("rules"));
      std::string out;
      (void)wire::append_frame(s.is_ok() ? wire::make_ack(m->id) : wire::make_error(m->id, s), out);
      break;
    }
    case wire::Type::kCollect: {
      json js, ji;
      to_json(js, stage().collect());
      to_json(ji, stage().info());
      std::string out;
      (void)wire::append_frame(
          wire::make_message(wire::Type::kStats, m->id, json{{"stats", js}, {"info", ji}}), out);
      break;
    }
    case wire::Type::kStats:
      if (auto it = m->body.find("stats"); it != m->body.end()) {
        (void)sluice::stage_stats_from_json(*it);
      }
      break;
    case wire::Type::kError:
      (void)wire::error_status(m->body);
      break;
    default:
      break;
  }
  (void)stage().enforce(sluice::Op::kWrite, size);
  return 0;
}
