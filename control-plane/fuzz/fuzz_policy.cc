// Fuzzes policy documents as the daemon takes them over the socket and the
// CLI reads them from files: parse_json_text, then parse_policy_doc (which
// configures the named policy), then one step of the policy on a stage. A
// document must be refused or taken, never throw or crash; a document taken
// from the wire names no file.
#include <cstddef>
#include <cstdint>
#include <string>

#include "policy_doc.h"
#include "sluice/json_text.h"
#include "sluice/objects/builtin.h"
#include "sluice/policy.h"

using nlohmann::json;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  sluice::objects::register_builtin();
  auto parsed = sluice::parse_json_text(text);
  if (!parsed) {
    if (parsed.status().message().rfind("invalid JSON: ", 0) != 0) __builtin_trap();
    return 0;
  }
  auto doc = sluice::control::parse_policy_doc(*parsed, /*from_wire=*/true, "/nonexistent");
  if (!doc) return 0;
  auto p = sluice::make_policy(doc->policy, doc->config);
  if (!p) return 0;
  sluice::PolicyInput in;
  in.interval_ns = 1'000'000'000;
  sluice::StageView v;
  v.name = "a";
  v.labels = {{"tenant", "t1"}};
  in.stages.push_back(v);
  (void)(*p)->step(in);
  return 0;
}
