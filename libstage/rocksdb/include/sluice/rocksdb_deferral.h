// DeferralActuator: applies a `deferral-gate` object's per-partition states
// (sluice/objects/deferral_gate.h) to the column families of an unmodified
// RocksDB, through its public API only (FlexEngine's two-stage compaction
// deferral).
//
// Each column family is one of the gate's partitions. Every poll (a
// background thread every poll_ms or when woken, e.g. by a
// DeferralWakeListener after a flush; or the caller's poll()) the actuator
// reads the partition's state without a lock and moves the column family's
// options to what that state wants, with SetOptions, changing only what
// differs from what it set last:
//
//   first-stage   max_bytes_for_level_base raised (deferred_level_base): the
//                 L1+ compaction scores fall below 1, so RocksDB picks only
//                 L0->L1 (TTL, periodic and marked-file compactions are not
//                 held this way); soft/hard_pending_compaction_bytes_limit 0
//                 (no pending-bytes stall while L1 grows)
//   second-stage  also disable_auto_compactions (no new L0->L1; running jobs
//                 finish), level0_slowdown/stop_writes_trigger raised to the
//                 L0 cap (max_l0_files), and intra-L0 compactions run by the
//                 actuator: CompactFiles into level 0 of the newest contiguous
//                 run of non-busy L0 files once L0 holds intra_l0_min_files,
//                 size-tiered (a file larger than the run picked so far ends
//                 the run), so files are merged only with their neighbours in
//                 sequence order and nothing is reordered
//   recovering    the configured values again, except the stall triggers
//                 (L0 triggers, pending-bytes limits), which stay where
//                 deferral put them while L0 holds at least the configured
//                 slowdown trigger's files (or the pending bytes pass the
//                 configured soft limit), at most recover_timeout_ms; then
//                 those too, and the actuator reports the partition
//                 recovered to the gate (-> normal)
//   normal        the configured values
//
// The configured values are the column family's options when the actuator
// starts (do not change these seven options behind its back while it runs:
// it would restore the old ones). Every option it changed is restored to
// them on resume (as above), when the decision expires (the gate reads as
// recovering once hold_ms passes without renewal: a control plane that died
// leaves nothing deferred), at once and in full when the gate is removed or
// shut down (a rule removed it, or Stage::shutdown()) and when the actuator
// stops (stop(), the destructor). A stage destroyed without shutdown() leaves
// the gate to the actuator (it holds a reference): its decisions expire
// within hold_ms, since nothing renews them.
//
// Bounds: the L0 cap ends a deferral when L0 reaches max_l0_files although
// intra-L0 compactions run (gate.end(p, "L0 cap")); the growth cap is the
// gate's: each poll reports the partition's growth (the bytes L0 and L1
// gained since it entered deferral, which FlexEngine keeps in memory), and the
// gate ends a deferral that would pass growth_cap_bytes and refuses new ones
// at it. Each poll also reports the L0 file count, the configured L0
// triggers, the estimated pending compaction bytes and the stall count, which
// a policy reads from the gate's collect.
//
// Nothing is lost: options and manual compactions change where data is
// merged, never what was written; an intra-L0 compaction takes contiguous
// files only (RocksDB adds any file between two picked ones itself and
// refuses with Aborted when one of them is busy: the actuator counts that and
// tries again next poll). RocksDB 7.8 orders L0 by sequence number: do not
// combine intra-L0 compaction with IngestExternalFile on the same column
// family. TenantGate::IsolateStalls moves the same triggers: create the
// actuator after it, or not on those column families.
//
// Thread safety: poll(), stop() and stats() are safe from any thread and
// serialised among themselves. CompactFiles runs on the polling thread. The
// column family handles and the DB must outlive the actuator (or stop() it
// first).
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
#include "sluice/objects/deferral_gate.h"
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
