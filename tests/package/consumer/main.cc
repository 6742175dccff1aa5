// Uses the installed headers and libraries: a stage with a token bucket.
#include <sluice/objects/builtin.h>
#include <sluice/stage.h>

#include <cstdio>

int main() {
  sluice::objects::register_builtin();
  auto stage = sluice::Stage::create();
  if (!stage.is_ok()) return 1;
  sluice::Status s = stage.value()->apply_text(R"([
    {"rule": "create_channel", "channel": "all", "default": true},
    {"rule": "create_object", "channel": "all", "object": "limit", "type": "drl",
     "config": {"rate": 1e9}}])");
  if (!s.is_ok()) return std::fprintf(stderr, "%s\n", s.to_string().c_str()), 1;
  stage.value()->enforce(sluice::Op::kRead, 4096);
  auto stats = stage.value()->collect();
  std::printf("consumer: %llu bytes through %s\n",
              static_cast<unsigned long long>(stats.total.bytes), stats.channels[0].name.c_str());
  return stats.total.bytes == 4096 ? 0 : 1;
}
