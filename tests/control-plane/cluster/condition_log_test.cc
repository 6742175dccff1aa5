// ConditionLog (control-plane/cluster/condition_log.h): a condition that holds
// step after step writes a line when it starts, when its message changes and
// when it ends, not one a step (etcd down for 5 s at 100 ms steps: 3 lines, not 50).
#include <memory>
#include <sstream>
#include <string>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <catch2/catch.hpp>

#include "condition_log.h"

namespace {

// The default logger's lines, for the test's life.
class Captured {
 public:
  Captured() : saved_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    sink->set_pattern("%l %v");
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("captured", sink));
  }
  ~Captured() { spdlog::set_default_logger(saved_); }
  std::string text() const { return out_.str(); }

 private:
  std::shared_ptr<spdlog::logger> saved_;
  std::ostringstream out_;
};

}  // namespace

TEST_CASE("a condition logs its start, its changes and its end, and counts the rest",
          "[cluster][log]") {
  Captured c;
  sluice::cluster::ConditionLog log("cluster 'c': writing decisions");
  log.ok();  // nothing held: nothing to say
  for (int i = 0; i < 50; ++i) log.fail("etcd unreachable");
  CHECK(log.failing());
  CHECK(log.repeats() == 49);
  log.fail("etcd answered 500");
  log.fail("etcd answered 500");
  log.ok();
  log.ok();
  CHECK_FALSE(log.failing());
  CHECK(c.text() ==
        "warning cluster 'c': writing decisions: etcd unreachable\n"
        "warning cluster 'c': writing decisions: etcd answered 500 (after 49 more of: etcd "
        "unreachable)\n"
        "info cluster 'c': writing decisions: recovered (1 repeats not logged)\n");
}
