// Fuzzes message validation and what a stage does with a valid message: the
// same path ControlClient takes (parse, then apply rules / collect).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "sluice/stage.h"
#include "sluice/wire.h"

namespace wire = sluice::wire;
using nlohmann::json;

namespace {

sluice::Stage& stage() {
  static std::unique_ptr<sluice::Stage> s = [] {
    auto st = sluice::Stage::create();
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
