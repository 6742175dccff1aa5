// Fuzzes message validation and what a stage does with a valid message: the
// same paths ControlClient takes (a daemon-form rules message applied from its
// text, else parse, then apply rules / collect). The text path must agree with
// the parsed one wherever it answers: same id, same batch, same status. So
// must the daemon's in-place reading of a stage's rules ack.
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
  // The daemon's reading of a stage's ack in place must agree with parsing it.
  if (auto ack = wire::view_rules_ack(payload)) {
    if (!m || m->type != wire::Type::kAck || m->id != ack->id ||
        m->body["rules_version"] != json(ack->rules_version)) {
      __builtin_trap();
    }
  }
  if (auto view = wire::view_rules_message(payload)) {
    // (nlohmann stops at a NUL byte as at the end of the text: such a batch
    // parses alone, yet the payload around it does not.)
    json batch = json::parse(view->batch, nullptr, /*allow_exceptions=*/false);
    if (!batch.is_discarded() && (batch.is_array() || batch.is_object()) &&
        view->batch.find('\0') == std::string_view::npos) {
      if (!m || m->type != wire::Type::kRules || m->id != view->id || m->body["rules"] != batch ||
          m->body["decided_ns"] != json(view->decided_ns)) {
        __builtin_trap();
      }
    }
    // Two fresh stages, one through each path, end up alike.
    auto fast = sluice::Stage::create();
    auto slow = sluice::Stage::create();
    if (!fast || !slow) __builtin_trap();
    if (auto st = (*fast)->try_apply_compact(view->batch)) {
      if (!m) __builtin_trap();  // it answered for a payload that is not JSON
      sluice::Status want = (*slow)->apply(m->body.at("rules"));
      if (st->code() != want.code() || st->message() != want.message()) __builtin_trap();
      if ((*fast)->rules_version() != (*slow)->rules_version()) __builtin_trap();
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
