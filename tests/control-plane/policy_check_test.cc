// `sluice policy check FILE [--json]`: a policy document read, validated and
// configured offline as the daemon would, and what the policy derives from
// it printed; a bad document is a usage error naming the field.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "policy_doc.h"

namespace {

using nlohmann::json;

constexpr std::uint64_t MiB = 1024 * 1024;

// A file under /tmp holding `doc`, removed when the test case ends.
class DocFile {
 public:
  explicit DocFile(const json& doc, const std::string& tag)
      : path_("/tmp/sluice-policy-check-" + std::to_string(::getpid()) + "-" + tag + ".json") {
    std::ofstream(path_) << doc.dump();
  }
  ~DocFile() { std::remove(path_.c_str()); }
  DocFile(const DocFile&) = delete;
  DocFile& operator=(const DocFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

json delta_fair_doc(json delta_ms, const char* rounding = "strict") {
  json tenants = json::array();
  for (int i = 1; i <= 16; ++i) {
    tenants.push_back({{"name", (i < 10 ? "t0" : "t") + std::to_string(i)}, {"weight", 1}});
  }
  return {{"policy", "delta-fair"},
          {"interval_ms", 250},
          {"config",
           {{"k", 2},
            {"tenants", tenants},
            {"write_buffer",
             {{"capacity", 2048 * MiB},
              {"segment", 64 * MiB},
              {"flush_bandwidth", 380 * MiB},
              {"delta_ms", delta_ms},
              {"rounding", rounding}}}}}};
}

// Runs the sluice binary; its exit code, stdout and stderr.
struct Run {
  int code = -1;
  std::string out, err;
};

Run run_sluice(const std::string& args) {
  const std::string err_path = "/tmp/sluice-policy-check-" + std::to_string(::getpid()) + ".err";
  const std::string cmd = std::string(SLUICE_BIN) + " " + args + " 2>" + err_path;
  Run r;
  std::FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path);
  r.err.assign(std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>());
  std::remove(err_path.c_str());
  return r;
}

}  // namespace

TEST_CASE("check_policy_file: the policy's name, interval and what it derives", "[policy_check]") {
  const DocFile f(delta_fair_doc(350), "ok");
  auto r = sluice::control::check_policy_file(f.path());
  REQUIRE(r.is_ok());
  CHECK(r->at("policy") == "delta-fair");
  CHECK(r->at("interval_ms") == 250);
  const json& wb = r->at("reservations").at("write_buffer");
  CHECK(wb.at("reserved_bytes") == 128 * MiB);
  CHECK(wb.at("reserved_fraction") == 0.0625);
  CHECK(wb.at("per_tenant_bytes").at("t01") == 64 * MiB);
  CHECK(r->at("config").at("k") == 2);

  // A policy without its own explain(): its describe(), members merged.
  const DocFile s(json{{"policy", "static"}, {"config", json::object()}}, "static");
  auto st = sluice::control::check_policy_file(s.path());
  REQUIRE(st.is_ok());
  CHECK(st->at("policy") == "static");
  CHECK(st->at("interval_ms").is_null());
  CHECK(st->at("replace") == true);
}

TEST_CASE("check_policy_file: errors name the file and the field", "[policy_check]") {
  json bad = delta_fair_doc(350);
  bad["config"]["write_buffer"]["segment"] = 0;
  const DocFile f(bad, "bad");
  auto r = sluice::control::check_policy_file(f.path());
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().code() == sluice::Code::kInvalidArgument);
  CHECK(r.status().message() == f.path() +
                                    ": policy 'delta-fair': write_buffer.segment: must be an "
                                    "integer number of bytes from 1 to 2^62, got 0");

  const DocFile doc(json{{"policy", "delta-fair"}, {"intervl_ms", 5}}, "doc");
  auto d = sluice::control::check_policy_file(doc.path());
  REQUIRE_FALSE(d.is_ok());
  CHECK(d.status().message().find("intervl_ms: unknown field") != std::string::npos);
}

TEST_CASE("sluice policy check: JSON with the reservations, exit 2 on a bad document",
          "[policy_check]") {
  const DocFile nearest(delta_fair_doc(500, "nearest"), "nearest");
  Run r = run_sluice("policy check --json " + nearest.path());
  REQUIRE(r.code == 0);
  const json out = json::parse(r.out);
  const json& wb = out.at("reservations").at("write_buffer");
  CHECK(wb.at("reserved_bytes") == 64 * MiB);  // Table 4's 3.1%
  CHECK(wb.at("reserved_fraction") == 0.03125);
  CHECK(wb.at("flush_time_ms").get<double>() > 500);

  const DocFile inf(delta_fair_doc("inf"), "inf");
  r = run_sluice("policy check " + inf.path());
  REQUIRE(r.code == 0);
  CHECK(r.out.find("write_buffer: reserved 0 B of 2.0 GiB (0.00%)") != std::string::npos);
  CHECK(r.out.find("t16") != std::string::npos);

  json bad = delta_fair_doc(350);
  bad["config"]["cache"] = json::object();
  const DocFile b(bad, "cache");
  r = run_sluice("policy check --json " + b.path());
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK(r.err.find("cache.capacity: required") != std::string::npos);
}

TEST_CASE("sluice policy check and rules apply refuse a document nested too deep, one line",
          "[policy_check]") {
  // 80,000 levels in a policy's config would overflow a recursive reader's stack.
  const std::string path = "/tmp/sluice-policy-check-" + std::to_string(::getpid()) + "-deep.json";
  {
    std::ofstream(path) << R"({"policy": "static", "config": )" << std::string(80000, '[')
                        << std::string(80000, ']') << "}";
  }
  auto r = sluice::control::check_policy_file(path);
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().message() ==
        path + ": invalid JSON: nested deeper than 64 levels of arrays and objects");
  for (const std::string args : {"policy check ", "rules apply --stage x "}) {
    const Run run = run_sluice(args + path);
    INFO(args << " -> " << run.code << " " << run.err);
    CHECK(run.code == (args.rfind("policy", 0) == 0 ? 2 : 1));  // a bad document; an error
    CHECK(run.err.find("nested deeper than 64 levels") != std::string::npos);
  }
  std::remove(path.c_str());
}

// FairDB §7.2.2's cache: 10 GiB, 32 readers (f = 320 MiB), R_read / AMP =
// 320 MiB/s (1280 MiB/s at AMP = 4).
json cache_member(json delta_ms) {
  return {{"capacity", 10 * 1024 * MiB},
          {"refill_bandwidth", 1280 * MiB},
          {"read_amplification", 4},
          {"delta_ms", delta_ms}};
}

json cache_doc(json delta_ms, int k) {
  json tenants = json::array();
  for (int i = 1; i <= 32; ++i) {
    tenants.push_back({{"name", (i < 10 ? "r0" : "r") + std::to_string(i)}, {"weight", 1}});
  }
  return {{"policy", "delta-fair"},
          {"config", {{"k", k}, {"tenants", tenants}, {"cache", cache_member(delta_ms)}}}};
}

TEST_CASE("check_policy_file: reservations.cache, Table 6's fractions", "[policy_check]") {
  const std::vector<double> pct = {25, 62.5, 75, 81.25, 85, 87.5};
  for (int k = 1; k <= 6; ++k) {
    INFO("k " << k);
    const DocFile f(cache_doc(750, k), "cache-k" + std::to_string(k));
    auto r = sluice::control::check_policy_file(f.path());
    REQUIRE(r.is_ok());
    const json& res = r->at("reservations");
    CHECK_FALSE(res.contains("write_buffer"));
    const json& c = res.at("cache");
    // Every reader reserves the same part of its 320 MiB: of the whole cache too.
    CHECK(c.at("reserved_fraction").get<double>() == Approx(pct[k - 1] / 100).epsilon(1e-12));
    CHECK(c.at("reserved_bytes").get<double>() ==
          Approx(pct[k - 1] / 100 * 10 * 1024 * MiB).epsilon(1e-12));
    CHECK(c.at("per_tenant_bytes").at("r17").get<double>() ==
          Approx(pct[k - 1] / 100 * 320 * MiB).epsilon(1e-12));
    CHECK(c.at("refill_time_ms").get<double>() == Approx(1000.0 * k));
  }
}

TEST_CASE("sluice policy check: the write buffer and the cache side by side", "[policy_check]") {
  json doc = delta_fair_doc(350);
  doc["config"]["cache"] = cache_member(250);
  doc["config"]["cache"]["capacity"] = 16 * 320 * MiB;  // f = 320 MiB for the 16 tenants
  const DocFile f(doc, "both");
  Run r = run_sluice("policy check --json " + f.path());
  REQUIRE(r.code == 0);
  const json out = json::parse(r.out);
  CHECK(out.at("reservations").at("write_buffer").at("reserved_bytes") == 128 * MiB);
  const json& c = out.at("reservations").at("cache");
  // k = 2: each ramp-up refills 160 MiB/s * 250 ms = 40 MiB within δ.
  CHECK(c.at("reserved_bytes") == 16 * 280 * MiB);
  CHECK(c.at("reserved_fraction") == 0.875);
  CHECK(c.at("per_tenant_bytes").at("t16") == 280 * MiB);
  CHECK(c.at("refill_time_ms").get<double>() == Approx(2000.0));  // k = 2
  CHECK(c.at("refill_time_reserved_ms").get<double>() == Approx(250.0));

  r = run_sluice("policy check " + f.path());
  REQUIRE(r.code == 0);
  CHECK(r.out.find("write_buffer: reserved 128.0 MiB of 2.0 GiB (6.25%)") != std::string::npos);
  CHECK(r.out.find("cache: reserved 4.4 GiB of 5.0 GiB (87.50%), delta 250.0 ms, k 2") !=
        std::string::npos);
  CHECK(r.out.find("refill bandwidth 1.2 GiB/s (configured), read amplification 4.00 "
                   "(configured); refill time without reservations 2000.0 ms; with them "
                   "250.0 ms") != std::string::npos);
  INFO(r.out);
}

TEST_CASE("sluice policy check: flex prints each partition's buckets and the node's",
          "[policy_check]") {
  const json doc = {{"policy", "flex"},
                    {"interval_ms", 1000},
                    {"config",
                     {{"node", {{"bandwidth", 200 * MiB}}},
                      {"partitions",
                       {{{"name", "p1"},
                         {"stage", "db1"},
                         {"rcu_max_per_s", 3000},
                         {"rcu_max_size", 4096},
                         {"read_amplification", 4},
                         {"wcu_max_per_s", 3000},
                         {"wcu_max_size", 1024}}}}}}};
  const DocFile f(doc, "flex");
  Run r = run_sluice("policy check --json " + f.path());
  REQUIRE(r.code == 0);
  const json out = json::parse(r.out);
  CHECK(out.at("partitions").at("p1").at("foreground_rate") == 51000 * 1024);
  CHECK(out.at("partitions").at("p1").at("background_rate") == MiB);
  CHECK(out.at("partitions").at("p1").at("lsm_ba") == 46);
  CHECK(out.at("node_rate") == 200 * MiB);
  r = run_sluice("policy check " + f.path());
  REQUIRE(r.code == 0);
  CHECK(r.out.find("node:     200.0 MiB/s") != std::string::npos);
  CHECK(r.out.find("p1") != std::string::npos);
  CHECK(r.out.find("49.8 MiB") != std::string::npos);  // 51000 KiB/s
}
