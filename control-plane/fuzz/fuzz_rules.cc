// Fuzzes rules batches: Stage::apply_text on a configured stage (atomic: a
// refused batch must leave the stage as it was), requests routed after it, and
// the static policy's validation of the same batch.
#include <cstddef>
#include <cstdint>
#include <string>

#include "sluice/policy.h"
#include "sluice/stage.h"

using nlohmann::json;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto st = sluice::Stage::create();
  if (!st) __builtin_trap();
  sluice::Stage& stage = **st;
  if (!stage
           .apply_text(R"({"version": 1, "rules": [
      {"rule": "differentiate", "classifiers": ["operation"]},
      {"rule": "create_channel", "channel": "w", "match": {"operation": "write"}},
      {"rule": "create_object", "channel": "w", "object": "o", "type": "noop"}]})")
           .is_ok()) {
    __builtin_trap();
  }
  json before;
  to_json(before, stage.info());
  sluice::Status s = stage.apply_text(text);
  json after;
  to_json(after, stage.info());
  if (!s.is_ok() && before != after) __builtin_trap();  // atomicity
  (void)stage.enforce(sluice::Op::kWrite, 4096);
  (void)stage.enforce(sluice::Op::kRead, 1);
  json stats;
  to_json(stats, stage.collect());
  (void)sluice::stage_stats_from_json(stats);

  json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
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
