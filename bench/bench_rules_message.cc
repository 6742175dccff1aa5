// sluice-bench-rules-message: the stage side of one rules message, alone.
//
// What a stage does with each rules frame the daemon sends (ControlClient's
// handling, without the socket): wire::parse_message, Stage::apply, the
// rules version and the ack frame (--generic, accepted, names that same
// path). The frames are the daemon's own
// (wire::make_rules_frame around wire::dump of the batch), a "configure" of
// a drl object with a new rate each time (what silk and maxmin send every
// cycle), or with --change layout the static policy's batch that removes
// and recreates the channel and object.
//
// Meant for deterministic instruction counts: under callgrind, only the loop
// is instrumented (when valgrind's header is available), so
//   valgrind --tool=callgrind --instr-atstart=no sluice-bench-rules-message 2000
// gives the loop's instructions; divide by the message count. Without
// valgrind it prints the mean wall-clock time per message (indicative).
//   sluice-bench-rules-message [MESSAGES] [--change configure|layout]
//                              [--stages N] [--evict BYTES]
//
// In sluice-bench-control a stage meets each message cold: between two
// changes its worker served the other stages and the kernel's socket work
// ran in between. --stages N sends each message to N stages in turn: with
// enough of them (20000 hold far more than the last-level cache) each
// stage's own state is cold while the code stays warm, as there. --evict
// BYTES also reads that much other memory before each message, which makes
// the code cold too (time only; the instruction counts do not change).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_STOP_INSTRUMENTATION
#endif

#include "control_rules.h"
#include "sluice/objects/builtin.h"
#include "sluice/stage.h"
#include "sluice/wire.h"

namespace {

using nlohmann::json;
namespace wire = sluice::wire;

json layout_batch(double rate) {
  return sluice::bench::drl_layout_batch(rate);
}

}  // namespace

int main(int argc, char** argv) {
  sluice::objects::register_builtin();
  int n = 1000;
  bool layout = false;
  int stages = 1;
  std::size_t evict = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--change") == 0 && i + 1 < argc) {
      layout = std::strcmp(argv[++i], "layout") == 0;
    } else if (std::strcmp(argv[i], "--stages") == 0 && i + 1 < argc) {
      stages = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--evict") == 0 && i + 1 < argc) {
      evict = static_cast<std::size_t>(std::max(0L, std::atol(argv[++i])));
    } else if (std::strcmp(argv[i], "--generic") == 0) {
      // the only path
    } else if (std::strcmp(argv[i], "--help") == 0) {
      std::printf(
          "usage: sluice-bench-rules-message [MESSAGES] [--change configure|layout] "
          "[--stages N] [--evict BYTES]\n"
          "--stages N: send every message to N stages in turn (default 1); with\n"
          "20000, each meets its message with its own state cold, the code warm\n"
          "--evict BYTES: read BYTES of other memory before each message (cold code\n"
          "too); the reading is timed apart and not counted\n");
      return 0;
    } else {
      n = std::max(1, std::atoi(argv[i]));
    }
  }
  std::vector<std::unique_ptr<sluice::Stage>> all;
  for (int k = 0; k < stages; ++k) {
    sluice::StageOptions o;
    o.name = "sim-" + std::to_string(k);
    auto created = sluice::Stage::create(o);
    if (!created.is_ok()) return 1;
    all.push_back(std::move(created).value());
    if (!all.back()->apply(layout_batch(1e12)).is_ok()) return 1;
  }
  std::vector<unsigned char> other(evict, 1);
  std::uint64_t evict_sum = 0;
  auto touch_other = [&] {
    for (std::size_t b = 0; b < other.size(); b += 64) evict_sum += other[b];
  };

  // The payloads, built beforehand as the daemon builds them.
  std::vector<std::string> payloads;
  payloads.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    const double rate = 1e12 + i + 1;
    json batch = json::array({json{{"rule", "configure"},
                                   {"channel", "all"},
                                   {"object", "limit"},
                                   {"config", {{"rate", rate}}}}});
    if (layout) batch = sluice::bench::drl_replacing_batch(rate);
    wire::SharedFrame f;
    if (!wire::make_rules_frame(static_cast<std::uint64_t>(i) + 2, 1'000'000'000 + i,
                                std::make_shared<const std::string>(wire::dump(batch)), f)
             .is_ok()) {
      return 1;
    }
    payloads.push_back(f.head.substr(wire::kHeaderSize) + *f.shared + f.tail);
  }

  std::string ack;
  std::uint64_t errors = 0;
  double evict_ns = 0;
  const auto t0 = std::chrono::steady_clock::now();
  CALLGRIND_START_INSTRUMENTATION;
  const long long total = static_cast<long long>(n) * stages;
  for (long long k = 0; k < total; ++k) {
    const std::string& payload = payloads[static_cast<std::size_t>(k / stages)];
    sluice::Stage& stage = *all[static_cast<std::size_t>(k % stages)];
    if (!other.empty()) {  // not the stage's work: timed apart and subtracted
      const auto e0 = std::chrono::steady_clock::now();
      touch_other();
      evict_ns +=
          std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - e0).count();
    }
    ack.clear();
    auto m = wire::parse_message(payload);
    const auto rules = m.is_ok() ? wire::read_rules(*m) : std::nullopt;
    if (!rules) {
      ++errors;
      continue;
    }
    if (!stage.apply(*rules->rules).is_ok()) {
      ++errors;
      continue;
    }
    wire::append_rules_ack_frame(rules->id, stage.rules_version(), ack);
  }
  CALLGRIND_STOP_INSTRUMENTATION;
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() -
      evict_ns;
  const auto messages = static_cast<double>(total);
  std::printf(
      "{\"bench\":\"rules_message\",\"path\":\"%s\",\"change\":\"%s\","
      "\"messages\":%.0f,\"stages\":%d,\"evict_bytes\":%zu,\"payload_bytes\":%zu,"
      "\"ns_per_message\":%.1f,\"errors\":%llu}\n",
      "parse_message", layout ? "layout" : "configure", messages, stages, evict,
      payloads.front().size(), ns / messages, static_cast<unsigned long long>(errors));
  volatile std::uint64_t keep = evict_sum;  // the reads are not optimised away
  (void)keep;
  return errors == 0 ? 0 : 1;
}
