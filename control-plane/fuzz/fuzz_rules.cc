// Fuzzes rules batches: Stage::apply_text on a configured stage (atomic: a
// refused batch must leave the stage as it was; text that is not JSON is
// refused as such), requests routed after it, a lease it took running out,
// and the static policy's validation of the same batch.
#include <cstddef>
#include <cstdint>
#include <string>

#include "sluice/json_text.h"
#include "sluice/objects/builtin.h"
#include "sluice/policy.h"
#include "sluice/stage.h"

using nlohmann::json;

namespace {
// A layout with a drl object, so that configure batches have something to
// configure.
constexpr const char* kLayout = R"({"version": 1, "rules": [
      {"rule": "differentiate", "classifiers": ["operation"]},
      {"rule": "create_channel", "channel": "w", "match": {"operation": "write"}},
      {"rule": "create_object", "channel": "w", "object": "o", "type": "noop"},
      {"rule": "create_channel", "channel": "r", "match": {"operation": "read"}},
      {"rule": "create_object", "channel": "r", "object": "limit", "type": "drl",
       "config": {"rate": 1e12}}]})";

// Requests are routed on simulated time: a batch may set any rate, and a
// request under a slow one would otherwise wait for real (for days).
sluice::SimClock& sim_clock() {
  static sluice::SimClock clock;
  return clock;
}
sluice::StageOptions sim_time() {
  sluice::StageOptions o;
  o.clock = &sim_clock();
  return o;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  sluice::objects::register_builtin();
  auto st = sluice::Stage::create(sim_time());
  if (!st) __builtin_trap();
  sluice::Stage& stage = **st;
  if (!stage.apply_text(kLayout).is_ok()) __builtin_trap();
  json before;
  to_json(before, stage.info());
  sluice::Status s = stage.apply_text(text);
  json after;
  to_json(after, stage.info());
  if (!s.is_ok() && before != after) __builtin_trap();  // atomicity
  // Text that is not JSON is refused as such, with nothing applied.
  auto read = sluice::parse_json_text(text);
  if (!read && (s.is_ok() || s.message() != read.status().message())) __builtin_trap();
  const json parsed = read ? std::move(read).value() : json(json::value_t::discarded);
  (void)stage.enforce(sluice::Op::kWrite, 4096);
  (void)stage.enforce(sluice::Op::kRead, 1);
  // A lease the batch took runs out: its fallback applies, and the lease is gone.
  if (auto left = stage.lease_left()) {
    sim_clock().advance(left->count());
    if (!stage.expire_lease() || stage.lease_left()) __builtin_trap();
    (void)stage.enforce(sluice::Op::kRead, 1);
  }
  json stats;
  to_json(stats, stage.collect());
  (void)sluice::stage_stats_from_json(stats);

  if (!parsed.is_discarded() && (parsed.is_array() || parsed.is_object())) {
    auto p = sluice::make_policy("static", json{{"rules", parsed}});
    if (p) {
      sluice::PolicyInput in;
      sluice::StageView v;
      v.name = "s";
      v.info = stage.info();
      in.stages.push_back(v);
      (void)(*p)->step(in);
    }
  }
  stage.shutdown();
  return 0;
}
