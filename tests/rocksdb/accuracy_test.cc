// Accuracy of the RocksDB binding's contexts: bytes the stage counted per origin versus
// RocksDB's own accounting, on a write-heavy workload with many flushes and compactions,
// with max_subcompactions 1 and 3.
//
// References:
//  - tickers FLUSH_WRITE_BYTES, COMPACT_READ_BYTES, COMPACT_WRITE_BYTES;
//  - the sizes of the table files RocksDB reports created (OnTableFileCreated, by
//    reason flush / compaction): exact for writes whatever the subcompaction count.
// With max_subcompactions > 1 the compaction tickers only see the I/O statistics of the
// compaction's own thread, not of the subcompaction threads (the facts file measured an
// undercount), so there the table-file sizes are the exact reference for compaction
// writes, and the read ticker is only a lower bound.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include <rocksdb/db.h>
#include <rocksdb/listener.h>
#include <rocksdb/options.h>
#include <rocksdb/statistics.h>
#include <rocksdb/table.h>

#include "rocksdb_test_util.h"
#include "sluice/rocksdb.h"

namespace rb = sluice::rocksdb_binding;
using sluice_test::Tally;
using sluice_test::TempDir;

namespace {

// Sums the sizes of created table files by reason (the exact output bytes).
class FileSizes : public rocksdb::EventListener {
 public:
  const char* Name() const override { return "FileSizes"; }
  void OnTableFileCreated(const rocksdb::TableFileCreationInfo& info) override {
    if (!info.status.ok()) return;
    if (info.reason == rocksdb::TableFileCreationReason::kFlush) {
      flush += info.file_size;
    } else if (info.reason == rocksdb::TableFileCreationReason::kCompaction) {
      compaction += info.file_size;
    }
  }
  void OnCompactionCompleted(rocksdb::DB*, const rocksdb::CompactionJobInfo& ci) override {
    compactions.fetch_add(1);
    if (ci.base_input_level == 0 && ci.output_level > 0) l0_to_base.fetch_add(1);
    if (ci.base_input_level > 0) ln.fetch_add(1);
  }
  void OnSubcompactionBegin(const rocksdb::SubcompactionJobInfo& si) override {
    if (si.subcompaction_job_id > 0) extra_subcompactions.fetch_add(1);
  }
  void OnFlushCompleted(rocksdb::DB*, const rocksdb::FlushJobInfo&) override {
    flushes.fetch_add(1);
  }
  std::atomic<std::uint64_t> flush{0}, compaction{0};
  std::atomic<int> flushes{0}, compactions{0}, l0_to_base{0}, ln{0}, extra_subcompactions{0};
};

struct RunResult {
  Tally tally;
  std::uint64_t flush_ticker = 0, compact_read_ticker = 0, compact_write_ticker = 0;
  std::uint64_t flush_files = 0, compaction_files = 0;
  rb::FsCounters fs;
  int flushes = 0, compactions = 0, l0_to_base = 0, ln = 0, extra_subcompactions = 0;
};

// Waits (at most 30 s) until no flush or compaction runs or is pending.
void wait_idle(rocksdb::DB* db) {
  (void)sluice::testing::wait_for(
      [db] {
        std::uint64_t flushes = 0, compactions = 0, pending = 0, mem = 0;
        db->GetIntProperty("rocksdb.num-running-flushes", &flushes);
        db->GetIntProperty("rocksdb.num-running-compactions", &compactions);
        db->GetIntProperty("rocksdb.compaction-pending", &pending);
        db->GetIntProperty("rocksdb.mem-table-flush-pending", &mem);
        return flushes + compactions + pending + mem == 0;
      },
      std::chrono::seconds(30));
}

RunResult run(int max_subcompactions, bool infer_background) {
  TempDir dir("accuracy-" + std::to_string(max_subcompactions));
  auto stage = sluice_test::counting_stage("accuracy");
  auto sizes = std::make_shared<FileSizes>();
  auto stats = rocksdb::CreateDBStatistics();
  RunResult r;
  {
    rocksdb::Options o;
    o.create_if_missing = true;
    o.statistics = stats;
    o.write_buffer_size = 256 << 10;
    o.max_write_buffer_number = 4;
    o.target_file_size_base = 256 << 10;
    o.max_bytes_for_level_base = 1 << 20;
    o.max_bytes_for_level_multiplier = 4;
    o.level0_file_num_compaction_trigger = 2;
    o.max_background_jobs = 4;
    o.max_subcompactions = static_cast<std::uint32_t>(max_subcompactions);
    o.compression = rocksdb::kNoCompression;
    o.listeners.push_back(sizes);
    rb::AttachOptions ao;
    ao.infer_background = infer_background;
    ao.audit_inference = true;
    auto b = rb::Attach(o, *stage, ao);
    REQUIRE(b.is_ok());
    std::unique_ptr<rocksdb::DB> db = sluice_test::open_db(o, dir.file("db"));

    // ~24 MiB of random-key puts: ~100 flushes and a few hundred compactions, L0..L3.
    std::mt19937_64 rng(42 + static_cast<unsigned>(max_subcompactions));
    rocksdb::WriteOptions wo;
    wo.disableWAL = false;
    const std::string value(200, 'v');
    char key[24];
    for (int i = 0; i < 120000; ++i) {
      std::snprintf(key, sizeof(key), "k%012llu", static_cast<unsigned long long>(rng() % 400000));
      REQUIRE(db->Put(wo, key, value).ok());
    }
    REQUIRE(db->Flush(rocksdb::FlushOptions()).ok());
    wait_idle(db.get());
    REQUIRE(db->Close().ok());
    r.fs = b->fs->counters();
  }
  r.tally.add(stage->collect());
  r.flush_ticker = stats->getTickerCount(rocksdb::FLUSH_WRITE_BYTES);
  r.compact_read_ticker = stats->getTickerCount(rocksdb::COMPACT_READ_BYTES);
  r.compact_write_ticker = stats->getTickerCount(rocksdb::COMPACT_WRITE_BYTES);
  r.flush_files = sizes->flush.load();
  r.compaction_files = sizes->compaction.load();
  r.flushes = sizes->flushes.load();
  r.compactions = sizes->compactions.load();
  r.l0_to_base = sizes->l0_to_base.load();
  r.ln = sizes->ln.load();
  r.extra_subcompactions = sizes->extra_subcompactions.load();
  return r;
}

double rel(std::uint64_t measured, std::uint64_t reference) {
  if (reference == 0) return measured == 0 ? 0.0 : 1.0;
  return (static_cast<double>(measured) - static_cast<double>(reference)) /
         static_cast<double>(reference);
}

void report(const char* name, int subcompactions, const RunResult& r) {
  const auto& t = r.tally;
  const std::uint64_t bg = t.get("flush", "write") + t.get("flush", "read") +
                           t.compaction("write") + t.compaction("read") + t.get("unknown", "read") +
                           t.get("unknown", "write");
  std::printf(
      "[%s] max_subcompactions=%d flushes=%d compactions=%d (L0->base %d, Ln %d) "
      "extra subcompaction threads=%d\n"
      "  flush write      stage=%llu ticker=%llu (%+.3f%%) files=%llu (%+.3f%%)\n"
      "  compaction write stage=%llu ticker=%llu (%+.3f%%) files=%llu (%+.3f%%)\n"
      "  compaction read  stage=%llu ticker=%llu (%+.3f%%)\n"
      "  by kind: L0_L1 w=%llu r=%llu  L0_L0 w=%llu r=%llu  LN w=%llu r=%llu  "
      "compaction(unknown level) w=%llu r=%llu\n"
      "  background table bytes outside a listener scope: %llu of %llu (%.4f%%), "
      "given the file's creation context: %llu; origin 'unknown': %llu\n"
      "  inference (db_bench plugin) agrees on %.3f%% of scoped table bytes\n",
      name, subcompactions, r.flushes, r.compactions, r.l0_to_base, r.ln, r.extra_subcompactions,
      static_cast<unsigned long long>(t.get("flush", "write")),
      static_cast<unsigned long long>(r.flush_ticker),
      100 * rel(t.get("flush", "write"), r.flush_ticker),
      static_cast<unsigned long long>(r.flush_files),
      100 * rel(t.get("flush", "write"), r.flush_files),
      static_cast<unsigned long long>(t.compaction("write")),
      static_cast<unsigned long long>(r.compact_write_ticker),
      100 * rel(t.compaction("write"), r.compact_write_ticker),
      static_cast<unsigned long long>(r.compaction_files),
      100 * rel(t.compaction("write"), r.compaction_files),
      static_cast<unsigned long long>(t.compaction("read")),
      static_cast<unsigned long long>(r.compact_read_ticker),
      100 * rel(t.compaction("read"), r.compact_read_ticker),
      static_cast<unsigned long long>(t.get("compaction_L0_L1", "write")),
      static_cast<unsigned long long>(t.get("compaction_L0_L1", "read")),
      static_cast<unsigned long long>(t.get("compaction_L0_L0", "write")),
      static_cast<unsigned long long>(t.get("compaction_L0_L0", "read")),
      static_cast<unsigned long long>(t.get("compaction_LN", "write")),
      static_cast<unsigned long long>(t.get("compaction_LN", "read")),
      static_cast<unsigned long long>(t.get("compaction", "write")),
      static_cast<unsigned long long>(t.get("compaction", "read")),
      static_cast<unsigned long long>(r.fs.unscoped_background_bytes),
      static_cast<unsigned long long>(bg),
      bg ? 100.0 * static_cast<double>(r.fs.unscoped_background_bytes) / static_cast<double>(bg)
         : 0.0,
      static_cast<unsigned long long>(r.fs.recovered_from_file_bytes),
      static_cast<unsigned long long>(t.get("unknown", "read") + t.get("unknown", "write")),
      100.0 * static_cast<double>(r.fs.audit_agree_bytes) /
          static_cast<double>(
              std::max<std::uint64_t>(1, r.fs.audit_agree_bytes + r.fs.audit_disagree_bytes)));
  std::fflush(stdout);
}

}  // namespace

TEST_CASE("per-context bytes match RocksDB's counters, max_subcompactions=1", "[rocksdb]") {
  const RunResult r = run(1, /*infer_background=*/false);
  report("accuracy", 1, r);
  const auto& t = r.tally;
  REQUIRE(r.flushes > 20);
  REQUIRE(r.compactions > 20);
  REQUIRE(r.ln > 0);
  // Flush writes: the ticker and the created files' sizes, within 1%.
  CHECK(std::abs(rel(t.get("flush", "write"), r.flush_ticker)) < 0.01);
  CHECK(std::abs(rel(t.get("flush", "write"), r.flush_files)) < 0.01);
  // Compaction writes and reads: the tickers are exact with one subcompaction.
  CHECK(std::abs(rel(t.compaction("write"), r.compact_write_ticker)) < 0.01);
  CHECK(std::abs(rel(t.compaction("write"), r.compaction_files)) < 0.01);
  CHECK(std::abs(rel(t.compaction("read"), r.compact_read_ticker)) < 0.01);
  // Every compaction byte has its kind and levels (no "compaction" of unknown level).
  CHECK(t.get("compaction", "write") == 0);
  CHECK(t.get("compaction_L0_L1", "write") > 0);
  CHECK(t.get("compaction_LN", "write") > 0);
  // Background bytes without a listener context: under 0.5%.
  const std::uint64_t bg = t.get("flush", "write") + t.compaction("write") + t.compaction("read") +
                           t.get("flush", "read");
  CHECK(static_cast<double>(r.fs.unscoped_background_bytes) < 0.005 * static_cast<double>(bg));
  // Without inference those bytes are "unknown" unless the file's creation context
  // covered them.
  CHECK(t.get("unknown", "read") + t.get("unknown", "write") + r.fs.recovered_from_file_bytes ==
        r.fs.unscoped_background_bytes);
}

TEST_CASE("per-context bytes with subcompaction threads, max_subcompactions=3", "[rocksdb]") {
  const RunResult r = run(3, /*infer_background=*/true);
  report("accuracy", 3, r);
  const auto& t = r.tally;
  REQUIRE(r.flushes > 20);
  REQUIRE(r.compactions > 20);
  CHECK(std::abs(rel(t.get("flush", "write"), r.flush_ticker)) < 0.01);
  CHECK(std::abs(rel(t.get("flush", "write"), r.flush_files)) < 0.01);
  // Compaction writes: exact against the created files; the ticker may only undercount.
  CHECK(std::abs(rel(t.compaction("write"), r.compaction_files)) < 0.01);
  CHECK(t.compaction("write") + t.compaction("write") / 100 >= r.compact_write_ticker);
  CHECK(t.compaction("read") + t.compaction("read") / 100 >= r.compact_read_ticker);
  if (r.extra_subcompactions == 0) {
    // No split happened: then the tickers are exact again.
    CHECK(std::abs(rel(t.compaction("write"), r.compact_write_ticker)) < 0.01);
    CHECK(std::abs(rel(t.compaction("read"), r.compact_read_ticker)) < 0.01);
  }
  const std::uint64_t bg = t.get("flush", "write") + t.compaction("write") + t.compaction("read") +
                           t.get("flush", "read");
  CHECK(static_cast<double>(r.fs.unscoped_background_bytes) < 0.005 * static_cast<double>(bg));
  CHECK(t.get("unknown", "read") + t.get("unknown", "write") == 0);  // inference on
}
