// The stage library on its own (linked without sluice::objects): it builds,
// knows no object type, and says where the built-in ones come from. Exits 0
// when it does.
#include <cstdio>
#include <string>

#include "sluice/registry.h"
#include "sluice/stage.h"

int main() {
  if (!sluice::Registry::global().names().empty()) {
    std::fprintf(stderr, "the global registry of the stage library alone is not empty\n");
    return 1;
  }
  auto stage = sluice::Stage::create();
  if (!stage.is_ok()) return std::fprintf(stderr, "%s\n", stage.status().to_string().c_str()), 1;
  // Pass-through works without any object type.
  (void)stage.value()->enforce(sluice::Op::kRead, 4096);
  if (stage.value()->collect().total.bytes != 4096) return 1;
  const sluice::Status s = stage.value()->apply_text(R"([
    {"rule": "create_channel", "channel": "all", "default": true},
    {"rule": "create_object", "channel": "all", "object": "limit", "type": "drl",
     "config": {"rate": 1000}}])");
  const std::string want =
      "rules[1]: type: unknown object type 'drl': no object types are registered (the built-in "
      "ones are added by sluice::objects::register_builtin(), sluice/objects/builtin.h)";
  if (s.message() != want) {
    std::fprintf(stderr, "got: %s\nwant: %s\n", s.message().c_str(), want.c_str());
    return 1;
  }
  return 0;
}
