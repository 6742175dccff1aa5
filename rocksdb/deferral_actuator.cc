// DeferralActuator (sluice/rocksdb_deferral.h): a deferral gate's states as
// RocksDB options and intra-L0 compactions, and their restoration.
#include <algorithm>
#include <string>
#include <unordered_map>

#include <rocksdb/options.h>

#include "sluice/rocksdb_deferral.h"

#include "sluice/objects/deferral_gate.h"

namespace sluice::rocksdb_binding {
namespace rdb = ::rocksdb;

namespace {

constexpr const char* kLevelBase = "max_bytes_for_level_base";
constexpr const char* kSoft = "soft_pending_compaction_bytes_limit";
constexpr const char* kHard = "hard_pending_compaction_bytes_limit";
constexpr const char* kDisable = "disable_auto_compactions";
constexpr const char* kSlowdown = "level0_slowdown_writes_trigger";
constexpr const char* kStop = "level0_stop_writes_trigger";
// The stall triggers recovering keeps raised while the tree is above them.
constexpr const char* kTriggers[] = {kSlowdown, kStop, kSoft, kHard};

bool deferred(DeferralState s) noexcept {
  return s == DeferralState::kFirstStage || s == DeferralState::kSecondStage;
}

std::uint64_t map_number(const std::map<std::string, std::string>& m, const char* key) {
  auto it = m.find(key);
  return it == m.end() ? 0 : std::strtoull(it->second.c_str(), nullptr, 10);
}

}  // namespace

struct DeferralActuator::Family {
  rdb::ColumnFamilyHandle* cf = nullptr;
  std::string key;
  DeferralGate::Partition* part = nullptr;
  std::map<std::string, std::string> configured;   // the values restored
  std::map<std::string, std::string> current;      // the values set now
  std::uint64_t slowdown = 0, stop = 0, soft = 0;  // configured
  std::uint64_t cap = 0;                           // the L0 cap
  bool deferring = false;                          // since entering a stage
  std::uint64_t baseline = 0;                      // L0 + L1 bytes when it entered
  std::int64_t recover_since = -1;
  DeferralFamilyStats stats;
};

DeferralActuator::DeferralActuator(rdb::DB* db, DeferralActuatorOptions options)
    : db_(db), options_(std::move(options)), clock_(&options_.gate->clock()) {}

StatusOr<std::shared_ptr<DeferralGate>> DeferralActuator::find_gate(const Stage& stage,
                                                                    std::string_view channel,
                                                                    std::string_view object) {
  std::shared_ptr<EnforcementObject> o = stage.object(channel, object);
  if (o == nullptr) {
    return Status::not_found("stage '" + stage.name() + "' has no object '" + std::string(object) +
                             "' in channel '" + std::string(channel) + "'");
  }
  if (o->type() != "deferral-gate") {
    return Status::invalid("object '" + std::string(object) + "' in channel '" +
                           std::string(channel) + "' is a " + std::string(o->type()) +
                           ", not a deferral-gate");
  }
  return std::static_pointer_cast<DeferralGate>(std::move(o));
}

StatusOr<std::unique_ptr<DeferralActuator>> DeferralActuator::start(
    rdb::DB* db, DeferralActuatorOptions options) {
  if (db == nullptr) return Status::invalid("db: required");
  if (!options.gate) return Status::invalid("gate: required");
  if (options.families.empty()) return Status::invalid("families: at least one column family");
  if (options.poll_ms < 0)
    return Status::invalid("poll_ms: must be >= 0, got " + std::to_string(options.poll_ms));
  if (options.intra_l0_min_files < 2) {
    return Status::invalid("intra_l0_min_files: must be >= 2, got " +
                           std::to_string(options.intra_l0_min_files));
  }
  if (options.intra_l0_max_files < options.intra_l0_min_files) {
    return Status::invalid("intra_l0_max_files: must be >= intra_l0_min_files (" +
                           std::to_string(options.intra_l0_min_files) + "), got " +
                           std::to_string(options.intra_l0_max_files));
  }
  if (options.max_l0_files < 0) {
    return Status::invalid("max_l0_files: must be >= 0, got " +
                           std::to_string(options.max_l0_files));
  }
  if (options.deferred_level_base == 0) return Status::invalid("deferred_level_base: must be > 0");
  if (options.recover_timeout_ms < 0) {
    return Status::invalid("recover_timeout_ms: must be >= 0, got " +
                           std::to_string(options.recover_timeout_ms));
  }
  std::unique_ptr<DeferralActuator> a(new DeferralActuator(db, std::move(options)));
  const DeferralActuatorOptions& o = a->options_;
  {
    MutexLock lock(a->mu_);
    for (std::size_t i = 0; i < o.families.size(); ++i) {
      const std::string field = "families[" + std::to_string(i) + "]";
      const DeferralFamily& df = o.families[i];
      if (df.cf == nullptr) return Status::invalid(field + ".cf: required");
      for (const auto& other : a->families_) {
        if (other->cf == df.cf) return Status::invalid(field + ".cf: listed twice");
        if (other->key == df.partition)
          return Status::invalid(field + ".partition: '" + df.partition + "' listed twice");
      }
      auto part = o.gate->partition(df.partition);
      if (!part) return part.status().with_prefix(field + ".");
      auto f = std::make_unique<Family>();
      f->cf = df.cf;
      f->key = df.partition;
      f->part = *part;
      const rdb::Options cfo = db->GetOptions(df.cf);
      f->configured = {
          {kLevelBase, std::to_string(cfo.max_bytes_for_level_base)},
          {kSoft, std::to_string(cfo.soft_pending_compaction_bytes_limit)},
          {kHard, std::to_string(cfo.hard_pending_compaction_bytes_limit)},
          {kDisable, cfo.disable_auto_compactions ? "true" : "false"},
          {kSlowdown, std::to_string(cfo.level0_slowdown_writes_trigger)},
          {kStop, std::to_string(cfo.level0_stop_writes_trigger)},
      };
      f->current = f->configured;
      f->slowdown = static_cast<std::uint64_t>(std::max(0, cfo.level0_slowdown_writes_trigger));
      f->stop = static_cast<std::uint64_t>(std::max(0, cfo.level0_stop_writes_trigger));
      f->soft = cfo.soft_pending_compaction_bytes_limit;
      f->cap = o.max_l0_files > 0 ? static_cast<std::uint64_t>(o.max_l0_files) : 2 * f->stop;
      if (f->cap < f->slowdown) {
        return Status::invalid("max_l0_files: must be at least " + field +
                               "'s level0_slowdown_writes_trigger (" + std::to_string(f->slowdown) +
                               "), got " + std::to_string(f->cap));
      }
      f->stats.partition = df.partition;
      a->families_.push_back(std::move(f));
    }
  }
  if (o.poll_ms > 0) a->thread_ = std::thread([p = a.get()] { p->run(); });
  return a;
}

DeferralActuator::~DeferralActuator() {
  (void)stop();
}

void DeferralActuator::run() {
  const std::int64_t period = options_.poll_ms * 1'000'000;
  for (;;) {
    {
      MutexLock lock(wait_mu_);
      const std::int64_t deadline = clock_->now_ns() + period;
      while (!quit_ && !woken_ && clock_->now_ns() < deadline)
        clock_->wait_until(lock.native(), wake_, deadline);
      if (quit_) return;
      woken_ = false;
    }
    (void)poll();
  }
}

void DeferralActuator::wake() {
  MutexLock lock(wait_mu_);
  woken_ = true;
  wake_.notify_all();
}

void DeferralWakeListener::attach(DeferralActuator* actuator) {
  MutexLock lock(mu_);
  actuator_ = actuator;
}

void DeferralWakeListener::OnFlushCompleted(rdb::DB* /*db*/, const rdb::FlushJobInfo& /*info*/) {
  MutexLock lock(mu_);
  if (actuator_ != nullptr) actuator_->wake();
}

Status DeferralActuator::stop() {
  {
    MutexLock lock(wait_mu_);
    quit_ = true;
    wake_.notify_all();
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  MutexLock lock(mu_);
  if (stopped_) return {};
  stopped_ = true;
  Status first;
  for (auto& f : families_) {
    Status s = poll_family_locked(*f, true);
    if (first.is_ok() && !s.is_ok()) first = s;
  }
  return first;
}

Status DeferralActuator::poll() {
  MutexLock lock(mu_);
  if (stopped_) return {};
  Status first;
  for (auto& f : families_) {
    Status s = poll_family_locked(*f, options_.gate->is_shut_down());
    if (first.is_ok() && !s.is_ok()) first = s;
  }
  return first;
}

Status DeferralActuator::set_locked(Family& f, const std::map<std::string, std::string>& want) {
  std::unordered_map<std::string, std::string> diff;
  for (const auto& [k, v] : want)
    if (f.current[k] != v) diff[k] = v;
  if (diff.empty()) return {};
  ++f.stats.set_options;
  const rdb::Status s = db_->SetOptions(f.cf, diff);
  if (!s.ok()) {
    return Status::io_error("SetOptions on partition '" + f.key + "': " + s.ToString());
  }
  for (const auto& [k, v] : diff) f.current[k] = v;
  return {};
}

Status DeferralActuator::poll_family_locked(Family& f, bool restore_all) {
  rdb::ColumnFamilyMetaData meta;
  db_->GetColumnFamilyMetaData(f.cf, &meta);
  std::uint64_t l0 = 0, upper_bytes = 0;
  if (!meta.levels.empty()) {
    l0 = meta.levels[0].files.size();
    upper_bytes = meta.levels[0].size;
  }
  if (meta.levels.size() > 1) upper_bytes += meta.levels[1].size;
  std::uint64_t pending = 0;
  (void)db_->GetIntProperty(f.cf, "rocksdb.estimate-pending-compaction-bytes", &pending);

  const DeferralState s = restore_all ? DeferralState::kNormal : options_.gate->state(*f.part);
  const std::int64_t now = clock_->now_ns();
  if (deferred(s) && !f.deferring) {
    f.deferring = true;
    f.baseline = upper_bytes;
  }
  f.recover_since =
      s == DeferralState::kRecovering ? (f.recover_since < 0 ? now : f.recover_since) : -1;

  std::map<std::string, std::string> want = f.configured;
  if (deferred(s)) {
    want[kLevelBase] = std::to_string(options_.deferred_level_base);
    want[kSoft] = "0";
    want[kHard] = "0";
  }
  if (s == DeferralState::kSecondStage) {
    want[kDisable] = "true";
    want[kSlowdown] = std::to_string(f.cap);
    want[kStop] = std::to_string(f.cap + (f.stop > f.slowdown ? f.stop - f.slowdown : 1));
  }
  if (s == DeferralState::kRecovering) {
    const bool above = l0 >= f.slowdown || (f.soft > 0 && pending >= f.soft);
    const bool in_time = now - f.recover_since < options_.recover_timeout_ms * 1'000'000;
    if (above && in_time)
      for (const char* k : kTriggers) want[k] = f.current[k];
  }
  Status st = set_locked(f, want);
  if (st.is_ok()) f.stats.applied = s;

  if (st.is_ok() && s == DeferralState::kSecondStage) {
    if (l0 >= f.cap) {
      ++f.stats.l0_cap_ends;
      options_.gate->end(*f.part, "L0 cap");
    } else if (l0 >= static_cast<std::uint64_t>(options_.intra_l0_min_files)) {
      st = intra_l0_locked(f, meta);
    }
  }
  const std::uint64_t growth =
      f.deferring && upper_bytes > f.baseline ? upper_bytes - f.baseline : 0;
  if (st.is_ok() && s == DeferralState::kRecovering && f.current == f.configured) {
    options_.gate->recovered(*f.part);
    f.deferring = false;
  }
  if (restore_all) f.deferring = false;
  f.stats.l0_files = l0;
  f.stats.growth_bytes = growth;
  if (!restore_all) {
    DeferralObservation o;
    o.l0_files = l0;
    o.l0_slowdown_trigger = f.slowdown;
    o.l0_stop_trigger = f.stop;
    o.growth_bytes = growth;
    o.pending_compaction_bytes = pending;
    o.intra_l0_compactions = f.stats.intra_l0;
    std::map<std::string, std::string> cfstats;
    if (db_->GetMapProperty(f.cf, "rocksdb.cfstats", &cfstats)) {
      o.stalls = map_number(cfstats, "io_stalls.total_stop") +
                 map_number(cfstats, "io_stalls.total_slowdown");
    }
    (void)options_.gate->observe(*f.part, o);
  }
  return st;
}

Status DeferralActuator::intra_l0_locked(Family& f, const rdb::ColumnFamilyMetaData& meta) {
  // L0 newest first: the newest contiguous run of files no compaction holds,
  // size-tiered (a file larger than the run so far ends it).
  const auto& files = meta.levels[0].files;
  std::size_t i = 0;
  while (i < files.size() && files[i].being_compacted) ++i;
  std::vector<std::string> pick;
  std::uint64_t bytes = 0;
  for (; i < files.size() && pick.size() < static_cast<std::size_t>(options_.intra_l0_max_files);
       ++i) {
    if (files[i].being_compacted) break;
    if (pick.size() >= 2 && files[i].size > bytes) break;
    pick.push_back(files[i].name);
    bytes += files[i].size;
  }
  if (pick.size() < 2) return {};
  const rdb::Status s = db_->CompactFiles(rdb::CompactionOptions(), f.cf, pick, 0);
  if (s.IsAborted()) {
    ++f.stats.intra_l0_aborted;
    return {};
  }
  if (!s.ok()) {
    return Status::io_error("intra-L0 compaction of partition '" + f.key + "': " + s.ToString());
  }
  ++f.stats.intra_l0;
  f.stats.intra_l0_files += pick.size();
  return {};
}

std::vector<DeferralFamilyStats> DeferralActuator::stats() const {
  MutexLock lock(mu_);
  std::vector<DeferralFamilyStats> out;
  for (const auto& f : families_) out.push_back(f->stats);
  return out;
}

std::map<std::string, std::map<std::string, std::string>> DeferralActuator::configured() const {
  MutexLock lock(mu_);
  std::map<std::string, std::map<std::string, std::string>> out;
  for (const auto& f : families_) out[f->key] = f->configured;
  return out;
}

}  // namespace sluice::rocksdb_binding
