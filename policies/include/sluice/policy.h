// Control policies: pure step functions from what the control plane observed
// to the rules it should send. A policy owns no socket, thread or clock: the
// daemon calls step() every loop interval with the collected statistics and
// the time, and sends what it returns. That makes every policy testable with
// tables of inputs and expected outputs.
//
// Thread safety: a Policy instance is used by one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/stage.h"
#include "sluice/stats.h"
#include "sluice/status.h"

namespace sluice {

// /proc/PID/io of a stage's process: cumulative and since the last step.
struct ProcIo {
  std::uint64_t read_bytes = 0;   // bytes this process caused to be read from storage
  std::uint64_t write_bytes = 0;  // ... written to storage
  std::uint64_t rchar = 0;        // bytes passed to read-like calls
  std::uint64_t wchar = 0;
  std::uint64_t delta_read_bytes = 0;
  std::uint64_t delta_write_bytes = 0;
  std::uint64_t delta_rchar = 0;
  std::uint64_t delta_wchar = 0;
  bool valid = false;  // false when /proc/PID/io could not be read
};

struct StageView {
  std::string name;  // unique among connected stages
  std::int64_t pid = 0;
  std::uint32_t uid = 0;
  std::map<std::string, std::string> labels;
  std::int64_t connected_at_ns = 0;
  // Rules batches of the policy's this stage refused since it connected: a
  // policy that sends only what changed sends everything again when it grows.
  std::uint64_t rules_refused = 0;
  StageInfo info;    // channels and objects as the stage reported them
  StageStats stats;  // deltas since the previous step
  ProcIo io;
};

struct PolicyInput {
  std::int64_t now_ns = 0;
  std::int64_t interval_ns = 0;  // the configured loop interval
  // When the daemon started serving, on now_ns's clock. Just after a
  // (re)start, stages of an earlier daemon are still reconnecting, each
  // enforcing the rules it had (fail-static): a policy may wait for them
  // before it hands their share to others (maxmin's startup_grace_ms).
  std::int64_t started_ns = 0;
  std::vector<StageView> stages;
  std::vector<std::string> departed;  // stages gone since the previous step
};

// A rules batch (docs/rules.md) as a policy hands it to the daemon: an
// immutable JSON value that copies share. A policy that sends one batch to
// many stages builds it once and copies it; the daemon then serialises it
// once (it tells batches apart by identity, never by comparing them).
// Converts from and to nlohmann::json, so a policy writes
// `out.rules[name] = json{...}` and a test compares `out.rules.at(name) == j`.
// Thread safety: the value never changes; copies may be read, copied and
// dropped from any threads.
class RulesBatch {
 public:
  RulesBatch() : value_(null_value()) {}
  RulesBatch(nlohmann::json value)  // NOLINT: implicit by design
      : value_(std::make_shared<const nlohmann::json>(std::move(value))) {}

  const nlohmann::json& value() const noexcept { return *value_; }
  operator const nlohmann::json&() const noexcept { return *value_; }  // NOLINT
  const nlohmann::json& operator*() const noexcept { return *value_; }
  const nlohmann::json* operator->() const noexcept { return value_.get(); }
  // A member of the batch object; throws nlohmann's out_of_range when absent.
  const nlohmann::json& operator[](const char* key) const { return value_->at(key); }
  // The same value, not a copy of it (what the daemon dedupes by).
  bool same_as(const RulesBatch& other) const noexcept { return value_ == other.value_; }
  const void* identity() const noexcept { return value_.get(); }

  friend bool operator==(const RulesBatch& a, const RulesBatch& b) {
    return a.same_as(b) || *a.value_ == *b.value_;
  }
  friend bool operator==(const RulesBatch& a, const nlohmann::json& b) { return *a.value_ == b; }
  friend std::ostream& operator<<(std::ostream& os, const RulesBatch& b) { return os << *b.value_; }

 private:
  static const std::shared_ptr<const nlohmann::json>& null_value() {
    static const auto* v =
        new std::shared_ptr<const nlohmann::json>(std::make_shared<const nlohmann::json>());
    return *v;
  }
  std::shared_ptr<const nlohmann::json> value_;
};

struct PolicyOutput {
  // Rules batches to send, by stage name (docs/rules.md). A stage absent here
  // gets nothing this step.
  std::map<std::string, RulesBatch> rules;
  // Free-form decisions for logs and `sluice policy show`.
  nlohmann::json report = nlohmann::json::object();
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string_view name() const noexcept = 0;
  // Validates and applies the policy's configuration (the "config" object of
  // the policy file); errors name the field.
  virtual Status configure(const nlohmann::json& config) = 0;
  // One control step.
  virtual PolicyOutput step(const PolicyInput& input) = 0;
  // The rules for a stage that has just said hello: the daemon sends them
  // right after the hello's answer, before anything else, and the stage
  // applies them before it enforces its first request (docs/protocol.md), so
  // that it is not left unthrottled until the first step after it came.
  // `input.stages` holds that stage alone, with its description but no
  // statistics or /proc counters yet; `departed` is empty. The stage is in
  // the next step's input as usual. A null batch (the default): nothing for
  // it until that step (the daemon sends it an empty batch).
  virtual RulesBatch admit(const PolicyInput& input);
  // The configuration in force, for `sluice policy show`.
  virtual nlohmann::json describe() const = 0;
  // What the policy derives from its configuration before any stage is seen
  // (and, after steps, from what it has measured since), for `sluice policy
  // check`: a JSON object. Default: describe().
  virtual nlohmann::json explain() const { return describe(); }
};

using PolicyFactory = std::function<std::unique_ptr<Policy>()>;

// Policies by name: "static", and more as they are written.
// Thread safety: safe from any thread.
Status register_policy(std::string name, PolicyFactory factory);
// A configured policy. An unknown name is an invalid-argument error listing
// the known ones; a config the policy refuses, its error, prefixed with the
// policy's name.
StatusOr<std::unique_ptr<Policy>> make_policy(std::string_view name, const nlohmann::json& config);
std::vector<std::string> policy_names();

}  // namespace sluice
