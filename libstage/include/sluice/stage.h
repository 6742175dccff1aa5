// The stage: classifies every request by its Context, routes it to a channel
// and to one enforcement object in it, enforces, and counts. A batch of rules
// (docs/rules.md) applies atomically; on error nothing changes and the Status
// names the rule and field. docs/design.md, "A request's path", has the path.
//
// enforce() and its inline part (sluice/stage_fast.h) allocate nothing, take
// no lock and make no system call on the pass-through and Noop paths, cost
// O(1) in channels, objects and rules, leave errno as they found it, and run
// their own I/O in an InternalIoScope, so an interposer may call them inside
// a libc call.
//
// Thread safety: enforce(), settle() and acquire() from any number of
// threads; apply(), collect() and info() from any thread, serialised among
// themselves, never blocking enforce(). A Stage outlives every call on it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/clock.h"
#include "sluice/context.h"
#include "sluice/enforcement_object.h"
#include "sluice/hold.h"
#include "sluice/registry.h"
#include "sluice/stats.h"
#include "sluice/status.h"

namespace sluice {

// Classifiers a differentiation rule may name.
enum class Classifier : std::uint8_t {
  kWorkflow = 0,
  kOperation,
  kSizeClass,
  kOrigin,
  kTenant,
  kLevel,
};
inline constexpr int kClassifierCount = 6;
std::string_view classifier_name(Classifier c) noexcept;
std::optional<Classifier> parse_classifier(std::string_view name) noexcept;
using ClassifierSet = std::uint8_t;  // bit (1 << Classifier)

struct StageOptions {
  std::string name = "stage";
  // Free-form labels reported in stage info and hello (e.g. {"app": "rocksdb"}).
  std::map<std::string, std::string> labels;
  Clock* clock = nullptr;              // null: system_clock()
  const Registry* registry = nullptr;  // null: Registry::global()
};

struct ObjectInfo {
  std::string name;
  std::string type;
  nlohmann::json match;  // array of match objects routing to it
  bool is_default = false;
  // Its slot on the stage's board (sluice/board.h), -1 when it has none (no
  // board, no tunables, or every slot taken); the tag a control plane writes
  // with its values; its tunables, in slot order.
  int board_slot = -1;
  std::uint64_t board_tag = 0;
  std::vector<std::string> tunables;
};
struct ChannelInfo {
  std::string name;
  std::vector<std::string> classifiers;  // object selection
  nlohmann::json match;
  bool is_default = false;
  std::vector<ObjectInfo> objects;
};
struct StageInfo {
  std::string name;
  std::int64_t pid = 0;
  std::map<std::string, std::string> labels;
  std::vector<std::string> classifiers;  // channel selection
  std::uint64_t rules_version = 0;       // bumps on every applied batch
  std::vector<ChannelInfo> channels;
};
// StageInfo's JSON form (a hello's and a collect answer's "info"), and back.
// stage_info_from_json takes what to_json writes, and is lenient where a
// description only informs: an object's board binding that is not well-formed
// leaves the object without one, a label or classifier that is not a string
// is skipped; a description that is not an object, or channels that are not
// an array of objects, are errors.
void to_json(nlohmann::json& j, const StageInfo& s);
StatusOr<StageInfo> stage_info_from_json(const nlohmann::json& j);

// Stage names: 1-128 characters of [A-Za-z0-9_.:@+-]. The one rule that
// Stage::create, the preload's SLUICE_STAGE and the daemon's hello apply (the
// daemon may append "-2", "-3", ... to tell two stages of one name apart).
inline constexpr std::size_t kMaxStageNameLength = 128;
inline constexpr std::string_view kStageNameRule = "1-128 characters of [A-Za-z0-9_.:@+-]";
bool valid_stage_name(std::string_view name) noexcept;

namespace detail {
struct StageAccess;  // sluice/stage_fast.h
}  // namespace detail

class Stage {
 public:
  static StatusOr<std::unique_ptr<Stage>> create(StageOptions options = {});
  // A stage configured from a local rules file (JSON), read with
  // read_rules_file(). The error names the file, and the rule and field at
  // fault; a file that is not JSON is reported by line and column, without
  // quoting its bytes.
  static StatusOr<std::unique_ptr<Stage>> from_rules_file(const std::string& path,
                                                          StageOptions options = {});
  ~Stage();
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;

  // Classifies, routes and enforces one request, which may wait in its
  // object. Never throws; never fails the request because of Sluice itself
  // (an object that is removed while a request waits returns
  // Outcome::kCancelled and the request proceeds). A binding on an
  // interposed call's way uses sluice/stage_fast.h, whose inline part
  // enforces most requests without a call.
  Verdict enforce(const Context& ctx) noexcept;
  // Convenience: make_context(op, size) on this thread, then enforce.
  Verdict enforce(Op op, std::uint64_t size) noexcept { return enforce(make_context(op, size)); }

  // The request enforced with `ctx` moved `actual_bytes` instead of ctx.size
  // (a short read, a failed call: 0). Corrects the byte counters that counted
  // it and settles the object's charge (EnforcementObject::settle) against
  // what it was charged before the call (ctx.size, or at most kMaxPreCharge
  // under kBounded); charging more may wait, never under kNoWait. Call it on
  // the enforcing thread, with the same ctx, before it enforces on another
  // stage, whenever actual_bytes differs from ctx.size or ctx.size exceeds
  // the pre-charge. Dropped if the rules changed in between. Never fails,
  // leaves errno alone; I/O while it waits runs inside an InternalIoScope.
  void settle(const Context& ctx, std::uint64_t actual_bytes) noexcept;

  // Takes `amount` units of capacity for ctx's flow. Routes ctx exactly as
  // enforce() does; when the target object holds capacity
  // (EnforcementObject::holds_capacity), acquires `amount` there, which may
  // wait (kWouldWait at once under context_flag::kNoWait, kCancelled once
  // the object is removed or shut down), and returns a Hold of what it
  // granted; otherwise enforces ctx with size = amount as a request
  // (context_flag::kBounded ignored: charged whole) and returns a Hold that
  // holds nothing but carries the verdict. Either way it is counted in the
  // target's statistics as one request of `amount` bytes with its wait (one
  // that would have waited under kNoWait is not counted). The Hold keeps the
  // object alive, so its release reaches the object that granted even after
  // the rules changed or the stage went away. Never throws; errno as found;
  // I/O made while it waits runs inside an InternalIoScope.
  Hold acquire(const Context& ctx, std::uint64_t amount) noexcept;

  // Checks a batch's form without a stage: every rule's kind and fields,
  // names, matches and classifiers, with the same messages as apply(). What
  // depends on a stage's layout (a channel that does not exist) is left to
  // apply().
  static Status check_rules(const nlohmann::json& batch);

  // Applies a batch of rules: a JSON array of rules, or an object
  // {"version": 1, "rules": [...]}. Atomic; see the file comment.
  Status apply(const nlohmann::json& rules);
  // Parses `text` as JSON first (parse errors name line and column).
  Status apply_text(std::string_view text);

  // Everything counted since the previous collect (the first collect covers
  // the time since creation). The stage keeps one cursor: a second consumer
  // (a program watching its own stage while the control plane collects)
  // should use totals() and compute its own differences. Nothing counted is
  // lost when rules remove a channel or object: what it counted and was not
  // collected yet (requests still in it when it was removed included, counted
  // when they finish) comes in the next collects under its name, added to the
  // channel or object of that name if the stage has one again, else as an
  // entry of its own (an object's without state).
  StageStats collect();
  // Everything counted since the stage was created; changes nothing. Objects
  // report their current state. Counts of removed channels and objects are
  // not included.
  StageStats totals() const;
  StageInfo info() const;
  // The object named `object` in channel `channel` now, or null: for a layer
  // that works with an object beyond the requests it routes (a cache reading
  // a cache-reserve object's thresholds). Keeps the object alive, as a Hold
  // does, after rules remove it.
  std::shared_ptr<EnforcementObject> object(std::string_view channel,
                                            std::string_view object) const;

  // The stage's board (sluice/board.h): memory shared with its control plane,
  // through which the control plane sets objects' tunables without a message.
  // Made on the first call, a sealed memfd mapped for the stage's life; every
  // object with tunables, now or created later, gets a slot on it (listed in
  // info()). Returns the board's file descriptor, which the stage owns
  // (close-on-exec), for the caller to hand to its control plane
  // (ControlClient sends it with its hello). Fails, with nothing changed,
  // where the system has no sealable memfd; the stage then works without.
  // The descriptor is a reserved one (sluice/reserved_fd.h): a host's dup2()
  // onto its number moves it, so the number returned is the board's only
  // while reserved_fd_generation() is unchanged (-1 once it was lost).
  StatusOr<int> board();
  // Board writes the stage's objects have applied (not counting values an
  // object refused), since the stage was created.
  std::uint64_t board_updates() const noexcept;

  // The rules' lease (a `lease` rule, docs/rules.md): what is left of it by the stage's
  // clock (zero once run out), or nullopt when none is in force. A later lease rule
  // replaces it.
  std::optional<std::chrono::nanoseconds> lease_left() const;
  // When the lease has run out: applies its fallback rules (each on its own, so that one
  // naming an object removed since leaves the rest applying), ends it and returns true.
  // Its control client calls it when lease_left() says, whether or not a daemon is
  // connected (a stopped daemon renews nothing).
  bool expire_lease() noexcept;
  // Leases that ran out, since the stage was created.
  std::uint64_t leases_expired() const;

  // info().rules_version without building the rest of StageInfo: what a
  // rules ack reports.
  std::uint64_t rules_version() const;
  const std::string& name() const noexcept;
  Clock& clock() const noexcept;

  // Wakes every waiting request (they proceed unenforced) and makes enforce()
  // a pass-through: for a host that is shutting the stage down.
  void shutdown() noexcept;

  struct Impl;

 private:
  friend struct detail::StageAccess;
  explicit Stage(std::unique_ptr<Impl> impl);
  // enforce() after its inline part refused (sluice/stage_fast.h).
  Verdict enforce_rest(const Context& ctx) noexcept;
  // enforce_rest()'s rest when the memo refuses: the grant's shortcut, else
  // the full way.
  [[gnu::noinline]] Verdict grant_or_full(const Context& ctx) noexcept;
  std::unique_ptr<Impl> impl_;
  const std::atomic<std::uint64_t>* version_;  // the published snapshot's version, in impl_
};

// Reads a whole file into a string; the error names the path and errno.
StatusOr<std::string> read_text_file(const std::string& path);

// The largest rules file read_rules_file() accepts. A stage holds at most
// 1,024 channels and objects; their rules take a few hundred KiB.
inline constexpr std::size_t kMaxRulesFileBytes = std::size_t{4} << 20;

// Reads a rules file (also a policy document, or anything else the daemon and
// the CLI read on a user's word): a regular file (a FIFO, a device or a directory is
// refused without reading it, so that /dev/zero cannot fill memory and a
// FIFO cannot block) of at most kMaxRulesFileBytes. The error names the
// path and what is wrong.
StatusOr<std::string> read_rules_file(const std::string& path);

}  // namespace sluice
