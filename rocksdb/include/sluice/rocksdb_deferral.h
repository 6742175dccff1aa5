// DeferralActuator: applies a `deferral-gate` object's per-partition states to the
// column families of an unmodified RocksDB through its public API (FlexEngine's
// two-stage compaction deferral): SetOptions for each state, and in the second stage
// intra-L0 CompactFiles of contiguous L0 files. It polls on a thread of its own (or
// when woken, or through poll()) and changes only what differs from what it set last.
// Every option it changed is restored to the values it found at start on resume,
// expiry, the gate's removal or shutdown, and stop(); do not change those options
// behind its back. It reports L0, triggers, pending bytes, growth and stalls to the
// gate. Do not combine it with IngestExternalFile on the same column family; create it
// after TenantGate::IsolateStalls. docs/rocksdb.md, "Compaction deferral", has each
// state's options.
//
// Thread safety: poll(), stop() and stats() are safe from any thread and serialised.
// The column family handles and the DB must outlive the actuator (or stop() it first).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/listener.h>

#include "sluice/clock.h"
#include "sluice/objects/types.h"
#include "sluice/stage.h"
#include "sluice/status.h"
#include "sluice/thread_annotations.h"

namespace sluice::rocksdb_binding {

struct DeferralFamily {
  rocksdb::ColumnFamilyHandle* cf = nullptr;  // not owned
  std::string partition;                      // the gate's partition key
};

struct DeferralActuatorOptions {
  std::shared_ptr<DeferralGate> gate;    // required
  std::vector<DeferralFamily> families;  // at least one, each once
  // The background thread's period; 0: no thread (the caller polls).
  std::int64_t poll_ms = 50;
  // First stage: max_bytes_for_level_base while deferred (1 TiB).
  std::uint64_t deferred_level_base = std::uint64_t{1} << 40;
  // Second stage: an intra-L0 compaction once L0 holds this many files (4, as
  // FlexEngine), merging at most intra_l0_max_files at once.
  int intra_l0_min_files = 4;
  int intra_l0_max_files = 32;
  // The L0 cap: the raised slowdown trigger; the stop trigger goes the
  // configured gap above it. 0: twice the configured stop trigger.
  int max_l0_files = 0;
  // Recovering keeps the stall triggers raised at most this long.
  std::int64_t recover_timeout_ms = 60'000;
};

// One column family's account.
struct DeferralFamilyStats {
  std::string partition;
  DeferralState applied = DeferralState::kNormal;  // what its options are set for
  std::uint64_t set_options = 0;                   // SetOptions calls made
  std::uint64_t intra_l0 = 0;                      // intra-L0 compactions done
  std::uint64_t intra_l0_files = 0;                // files they merged
  std::uint64_t intra_l0_aborted = 0;              // refused as busy
  std::uint64_t l0_cap_ends = 0;                   // deferrals ended at the L0 cap
  std::uint64_t l0_files = 0;                      // at the last poll
  std::uint64_t growth_bytes = 0;                  // at the last poll
};

class DeferralActuator {
 public:
  // Reads each column family's configured values and starts the thread.
  // Errors name the option ("families[1].partition: ...", "gate: required").
  static StatusOr<std::unique_ptr<DeferralActuator>> start(rocksdb::DB* db,
                                                           DeferralActuatorOptions options);
  // The deferral-gate object named `object` in channel `channel` of `stage`.
  static StatusOr<std::shared_ptr<DeferralGate>> find_gate(const Stage& stage,
                                                           std::string_view channel,
                                                           std::string_view object);
  ~DeferralActuator();
  DeferralActuator(const DeferralActuator&) = delete;
  DeferralActuator& operator=(const DeferralActuator&) = delete;

  // One round over the column families. The first error is returned after
  // every family had its turn.
  Status poll() SLUICE_EXCLUDES(mu_);
  // Makes the thread poll now rather than at the end of its period (after a
  // flush: DeferralWakeListener). Only signals: safe from any thread,
  // RocksDB's callbacks included. Nothing without a thread.
  void wake() SLUICE_EXCLUDES(wait_mu_);
  // Stops the thread and restores every option changed; later polls do
  // nothing. Idempotent.
  Status stop() SLUICE_EXCLUDES(mu_);
  std::vector<DeferralFamilyStats> stats() const SLUICE_EXCLUDES(mu_);
  // The options the actuator restores, per partition ({"max_bytes_for_level_base": "...", ...}).
  std::map<std::string, std::map<std::string, std::string>> configured() const SLUICE_EXCLUDES(mu_);

 private:
  struct Family;
  DeferralActuator(rocksdb::DB* db, DeferralActuatorOptions options);
  Status poll_family_locked(Family& f, bool restore_all) SLUICE_REQUIRES(mu_);
  Status set_locked(Family& f, const std::map<std::string, std::string>& want) SLUICE_REQUIRES(mu_);
  Status intra_l0_locked(Family& f, const rocksdb::ColumnFamilyMetaData& meta) SLUICE_REQUIRES(mu_);
  void run();

  rocksdb::DB* const db_;
  const DeferralActuatorOptions options_;
  Clock* const clock_;

  mutable Mutex mu_;
  std::vector<std::unique_ptr<Family>> families_ SLUICE_GUARDED_BY(mu_);
  bool stopped_ SLUICE_GUARDED_BY(mu_) = false;

  // The thread's wait.
  Mutex wait_mu_;
  std::condition_variable wake_;
  bool quit_ SLUICE_GUARDED_BY(wait_mu_) = false;
  bool woken_ SLUICE_GUARDED_BY(wait_mu_) = false;
  std::thread thread_;
};

// Wakes an actuator after every flush, so that an intra-L0 compaction
// follows a new L0 file at once rather than at the next poll. Listeners are
// DB options: make it before DB::Open (options.listeners), attach the
// actuator once it exists, and detach it (attach(nullptr)) before the
// actuator goes. Thread safety: attach() and the callback from any thread.
class DeferralWakeListener final : public rocksdb::EventListener {
 public:
  void attach(DeferralActuator* actuator) SLUICE_EXCLUDES(mu_);
  void OnFlushCompleted(rocksdb::DB* db, const rocksdb::FlushJobInfo& info) override
      SLUICE_EXCLUDES(mu_);
  const char* Name() const override { return "SluiceDeferralWake"; }

 private:
  Mutex mu_;
  DeferralActuator* actuator_ SLUICE_GUARDED_BY(mu_) = nullptr;
};

}  // namespace sluice::rocksdb_binding
