// What the RocksDB tenant gate (sluice/rocksdb_tenants.h) adds to a Put that does not
// wait: identical DBs written in interleaved rounds, each Put 16 B key + 100 B value
// into a tenant column family, no WAL (so that RocksDB's own cost is the memtable insert,
// and the gate's share is as large as it can be):
//   plain       the DB without a gate
//   gate-free   through a TenantGate whose pool grants at once and holds (the gate's own
//               work: batch walk, ledger, one acquire call)
//   gate-stage  through a TenantGate on a stage routing the writes to a noop object
//               (StageAdmission: Stage::acquire of a per-request object)
//   gate-pool   through a TenantGate on a stage with a "buffer-pool" object large
//               enough never to wait (only when that object type is registered)
// Time is the thread's CPU time (CLOCK_THREAD_CPUTIME_ID): preemption by other processes
// does not count. Prints ns per Put min / median / max over the rounds and the median's
// difference from plain; JSON lines on stderr.
//
// Usage: sluice-bench-tenant-gate [--ops N] [--rounds R] [--dir DIR]
#include <time.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <rocksdb/db.h>

#include "rocksdb_rules.h"
#include "sluice/objects/builtin.h"
#include "sluice/registry.h"
#include "sluice/rocksdb_tenants.h"
#include "sluice/stage.h"
#include "support/percentile.h"

namespace {

namespace rdb = ::rocksdb;
namespace rb = sluice::rocksdb_binding;

double cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

// Grants every acquire at once and holds it: what a pool with room does, at no cost.
class FreePool final : public rb::Admission {
 public:
  rb::Admitted acquire(const sluice::Context& /*ctx*/, std::uint64_t n) noexcept override {
    held_.fetch_add(n, std::memory_order_relaxed);
    return {{sluice::Outcome::kOk, 0}, n};
  }
  void release(const sluice::Context& /*ctx*/, std::uint64_t n) noexcept override {
    held_.fetch_sub(n, std::memory_order_relaxed);
  }

 private:
  std::atomic<std::uint64_t> held_{0};
};

struct Variant {
  std::string name;
  std::unique_ptr<rdb::DB> db;  // a TenantGate, or the plain DB
  rdb::ColumnFamilyHandle* cf = nullptr;
  std::vector<rdb::ColumnFamilyHandle*> plain_handles;  // the plain DB's, to destroy
  std::vector<double> ns;
  std::uint64_t next = 0;
};

rdb::DBOptions db_options() {
  rdb::DBOptions o;
  o.create_if_missing = true;
  o.create_missing_column_families = true;
  return o;
}

std::vector<rdb::ColumnFamilyDescriptor> column_families() {
  rdb::ColumnFamilyOptions cf;
  cf.write_buffer_size = 64 << 20;
  return {{rdb::kDefaultColumnFamilyName, cf}, {"t1", cf}};
}

bool open_gate(Variant& v, const std::string& path, rb::TenantGateOptions g) {
  g.tenants.mode = rb::TenantMode::kColumnFamily;
  g.tenants.cf_tenants = {{"t1", 1}};
  std::vector<rdb::ColumnFamilyHandle*> handles;
  auto r = rb::TenantGate::Open(db_options(), path, column_families(), &handles, std::move(g));
  if (!r.is_ok()) {
    std::fprintf(stderr, "%s: %s\n", v.name.c_str(), r.status().to_string().c_str());
    return false;
  }
  v.db = std::move(r).value();
  v.cf = handles[1];
  return true;
}

double put_round(Variant& v, std::size_t ops) {
  rdb::WriteOptions wo;
  wo.disableWAL = true;
  const std::string value(100, 'v');
  char key[32];
  const double t0 = cpu_ns();
  for (std::size_t i = 0; i < ops; ++i) {
    std::snprintf(key, sizeof(key), "key%013llu", static_cast<unsigned long long>(v.next++));
    if (!v.db->Put(wo, v.cf, rdb::Slice(key, 16), value).ok()) std::abort();
  }
  return (cpu_ns() - t0) / static_cast<double>(ops);
}

}  // namespace

int main(int argc, char** argv) {
  sluice::objects::register_builtin();
  std::size_t ops = 100000;
  int rounds = 7;
  std::string dir = "/tmp/sluice-bench-tenant-gate";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--ops") ops = std::strtoull(argv[i + 1], nullptr, 10);
    if (k == "--rounds") rounds = std::atoi(argv[i + 1]);
    if (k == "--dir") dir = argv[i + 1];
  }
  if (ops == 0 || rounds <= 0) {
    std::fprintf(stderr, "--ops and --rounds must be positive\n");
    return 2;
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);

  auto noop_stage = sluice::Stage::create({});
  auto pool_stage = sluice::Stage::create({});
  if (!noop_stage.is_ok() || !pool_stage.is_ok()) return 1;
  if (!(*noop_stage)->apply(sluice::bench::per_origin_noop_rules()).is_ok()) return 1;
  const bool have_pool = sluice::Registry::global().contains("buffer-pool");
  if (have_pool) {
    const nlohmann::json rules =
        nlohmann::json::array({{{"rule", "create_channel"}, {"channel", "w"}, {"default", true}},
                               {{"rule", "create_object"},
                                {"channel", "w"},
                                {"object", "write_buffer"},
                                {"type", "buffer-pool"},
                                {"config", {{"capacity", std::uint64_t{1} << 40}}}}});
    const sluice::Status s = (*pool_stage)->apply(rules);
    if (!s.is_ok()) {
      std::fprintf(stderr, "buffer-pool rules: %s\n", s.to_string().c_str());
      return 1;
    }
  }

  std::vector<Variant> vs;
  {
    Variant plain;
    plain.name = "plain";
    rdb::DB* raw = nullptr;
    if (!rdb::DB::Open(db_options(), dir + "/plain", column_families(), &plain.plain_handles, &raw)
             .ok()) {
      return 1;
    }
    plain.db.reset(raw);
    plain.cf = plain.plain_handles[1];
    vs.push_back(std::move(plain));
  }
  {
    Variant v;
    v.name = "gate-free";
    rb::TenantGateOptions g;
    g.admission = std::make_shared<FreePool>();
    if (!open_gate(v, dir + "/free", g)) return 1;
    vs.push_back(std::move(v));
  }
  {
    Variant v;
    v.name = "gate-stage";
    rb::TenantGateOptions g;
    g.stage = noop_stage->get();
    if (!open_gate(v, dir + "/stage", g)) return 1;
    vs.push_back(std::move(v));
  }
  if (have_pool) {
    Variant v;
    v.name = "gate-pool";
    rb::TenantGateOptions g;
    g.stage = pool_stage->get();
    if (!open_gate(v, dir + "/pool", g)) return 1;
    vs.push_back(std::move(v));
  }

  for (auto& v : vs) put_round(v, ops / 10);  // warm up
  for (int r = 0; r < rounds; ++r) {
    // Rotate the order so that no variant always runs first.
    for (std::size_t j = 0; j < vs.size(); ++j) {
      Variant& v = vs[(j + static_cast<std::size_t>(r)) % vs.size()];
      v.ns.push_back(put_round(v, ops));
    }
  }

  const double base = sluice::bench::spread(vs[0].ns).median;
  std::printf("%-12s %28s %10s\n", "variant", "CPU ns/Put min / median / max", "delta ns");
  for (auto& v : vs) {
    const sluice::bench::Spread x = sluice::bench::spread(v.ns);
    std::printf("%-12s %8.0f / %8.0f / %8.0f %+10.0f\n", v.name.c_str(), x.min, x.median, x.max,
                x.median - base);
    std::fprintf(stderr,
                 "{\"variant\":\"%s\",\"ns_min\":%.1f,\"ns_median\":%.1f,\"ns_max\":%.1f,"
                 "\"delta_ns\":%.1f}\n",
                 v.name.c_str(), x.min, x.median, x.max, x.median - base);
  }
  for (auto& v : vs) {
    for (auto* h : v.plain_handles) (void)v.db->DestroyColumnFamilyHandle(h);
    v.db.reset();
  }
  std::filesystem::remove_all(dir);
  return 0;
}
