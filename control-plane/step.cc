// The control loop's step, after each collect round: measure (what the
// stages answered, their /proc/PID/io), decide (the policy's step), write the
// tunables to the stages' boards, send the rules messages, report. Also the
// policy in force (installing one), a new stage's first rules, and the
// stages' answers to the policy's rules.
#include <sched.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "daemon_impl.h"
#include "proc_io.h"

namespace sluice::control {

using nlohmann::json;

namespace {

// What a policy sees of stage session `s` (its statistics aside).
StageView view_of(const Session& s) {
  StageView v;
  v.name = s.name;
  v.pid = s.cred.pid;
  v.uid = s.cred.uid;
  v.labels = s.labels;
  v.connected_at_ns = s.connected_at_ns;
  v.rules_refused = s.rules_refused;
  v.info = s.info;
  return v;
}

// Calls fn(stage, batch) for every connected stage the policy has a batch
// for. The batches and the stages are both maps by name: walked together
// rather than every name looked up. fn may close the stage's session (which
// takes it out of `stages`): the walk has moved past it, and holds it.
template <typename Fn>
void for_each_addressed(std::map<std::string, std::shared_ptr<Session>>& stages,
                        const PolicyOutput& out, Fn&& fn) {
  auto st = stages.begin();
  for (const auto& [name, batch] : out.rules) {
    while (st != stages.end() && st->first < name) ++st;
    if (st == stages.end()) break;
    if (st->first != name) continue;
    std::shared_ptr<Session> stage = st->second;
    ++st;
    fn(*stage, batch);
  }
}

// A rules batch the boards can carry: configure rules only, every config value
// a finite number. What a stage does with it through its board is what it
// does with the message: the batch has the form the stage's own parser
// accepts, a rule naming an object the stage does not list (or a field that
// is not one of that object's tunables) keeps the whole batch off that
// stage's board, and the object checks the values as configure() does.
struct BoardPlan {
  struct Set {
    std::string channel;
    std::string object;
    std::vector<std::pair<std::string, double>> values;
  };
  std::vector<Set> sets;
};

std::optional<BoardPlan> board_plan(const json& batch) {
  const json* rules = &batch;
  if (batch.is_object()) {
    auto it = batch.find("rules");
    if (it == batch.end()) return std::nullopt;
    rules = &*it;
  }
  if (!rules->is_array() || rules->empty()) return std::nullopt;
  for (const json& r : *rules) {  // before the full check: most batches fail here
    auto kind = r.is_object() ? r.find("rule") : r.end();
    if (!r.is_object() || kind == r.end() || *kind != "configure") return std::nullopt;
  }
  if (!Stage::check_rules(batch).is_ok()) return std::nullopt;
  BoardPlan plan;
  for (const json& r : *rules) {
    BoardPlan::Set set;
    set.channel = r.at("channel").get<std::string>();
    set.object = r.at("object").get<std::string>();
    for (const auto& [k, v] : r.at("config").items()) {
      if (!v.is_number() || !std::isfinite(v.get<double>())) return std::nullopt;
      set.values.emplace_back(k, v.get<double>());
    }
    plan.sets.push_back(std::move(set));
  }
  return plan;
}

struct BoardWrite {
  std::size_t slot;
  std::uint64_t tag;
  std::uint64_t mask;
  std::array<double, kMaxTunables> values;
};

// Writes `plan` to `s`'s board. False, with nothing written, when a rule names
// an object the stage did not list with a board slot, or a field that is not
// one of that object's tunables: that stage gets the batch as a message only.
// `writes` is scratch space, reused from stage to stage.
bool write_board(Session& s, const BoardPlan& plan, std::vector<BoardWrite>& writes) {
  writes.clear();
  for (const BoardPlan::Set& set : plan.sets) {
    const ObjectInfo* oi = nullptr;
    for (const ChannelInfo& c : s.info.channels) {
      if (c.name != set.channel) continue;
      for (const ObjectInfo& o : c.objects) {
        if (o.name == set.object) oi = &o;
      }
    }
    if (oi == nullptr || oi->board_slot < 0) return false;
    BoardWrite w{static_cast<std::size_t>(oi->board_slot), oi->board_tag, 0, {}};
    for (const auto& [field, value] : set.values) {
      auto t = std::find(oi->tunables.begin(), oi->tunables.end(), field);
      if (t == oi->tunables.end()) return false;
      const auto i = static_cast<std::size_t>(t - oi->tunables.begin());
      w.mask |= std::uint64_t{1} << i;
      w.values[i] = value;
    }
    writes.push_back(w);
  }
  for (const BoardWrite& w : writes) s.board.write(w.slot, w.tag, w.mask, w.values);
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------
// The policy in force.

Status PolicyStep::install(PolicyDoc new_doc, std::string new_source) {
  auto p = make_policy(new_doc.policy, new_doc.config);
  if (!p) return p.status();
  policy = d.opt.wrap_policy ? d.opt.wrap_policy(std::move(*p)) : std::move(*p);
  doc = std::move(new_doc);
  source = std::move(new_source);
  const int want =
      d.opt.interval_ms ? *d.opt.interval_ms : doc.interval_ms.value_or(kDefaultIntervalMs);
  if (want != interval_ms) {
    interval_ms = want;
    if (!d.stopped && d.conns.acceptor.is_open()) d.rounds.start();
  }
  spdlog::info("policy '{}' from {} (interval {} ms)", doc.policy, source, interval_ms);
  return Status::ok();
}

void PolicyStep::free_last() {
  retired_in = PolicyInput{};
  retired_out = PolicyOutput{};
}

// ---------------------------------------------------------------------------
// The step.

PolicyInput PolicyStep::measure(std::int64_t now) {
  PolicyInput in;
  in.now_ns = now;
  in.interval_ns = std::int64_t{interval_ms} * 1'000'000;
  in.started_ns = d.started_ns;
  std::map<std::int64_t, ProcIo> io_by_pid;  // stages of one process read it once
  for (auto& [name, s] : d.stages.by_name) {
    if (s->collect_id != 0) continue;  // late: its stats are not in yet
    StageView v = view_of(*s);
    v.stats = std::move(s->stats);
    s->stats = StageStats{};
    auto it = io_by_pid.find(v.pid);
    if (it == io_by_pid.end()) it = io_by_pid.emplace(v.pid, read_proc_io(v.pid)).first;
    s->io_last = advance_proc_io(it->second, s->io_prev);
    v.io = s->io_last;
    in.stages.push_back(std::move(v));
  }
  in.departed = std::move(d.stages.departed);
  d.stages.departed.clear();
  return in;
}

void PolicyStep::run() {
  if (!policy) return;
  PolicyInput in = measure(now_ns());
  PolicyOutput out;
  try {
    out = policy->step(in);
  } catch (const std::exception& e) {
    spdlog::error("policy '{}' step failed: {}", policy->name(), e.what());
    return;
  }
  last_report = std::move(out.report);
  const std::int64_t decided = now_ns();
  decided_ns = decided;
  unanswered = 0;
  if (d.observer) d.observer->step_decided(decided);
  // Tunables go to the boards first: the change is in effect in those stages
  // before the first frame leaves (the frames then wake them to answer).
  write_boards(out, decided);
  const std::size_t sent = send_rules(out, decided);
  if (d.observer) d.observer->step_sent(decided, sent);
  // Hand the CPU to the stages just woken. A write to a Unix socket wakes its
  // reader with the kernel's "the writer is about to sleep" hint, so Linux
  // often queues the woken stage threads on this CPU, behind the daemon,
  // rather than on an idle one. The daemon does not sleep, though: it goes on
  // to read the acks, and the queued stages would wait until it ran out of
  // work. Yielding once, after the last frame, lets them apply their rules
  // first; the acks wait. Where the stages run elsewhere it is a syscall that
  // returns at once.
  if (sent > 0) ::sched_yield();
  write_report();              // after the rules left: the log never delays them
  retired_in = std::move(in);  // freed at the next tick (see retired_in)
  retired_out = std::move(out);
}

void PolicyStep::write_boards(const PolicyOutput& out, std::int64_t decided) {
  std::unordered_map<const void*, std::optional<BoardPlan>> plans;  // by batch identity
  std::vector<BoardWrite> scratch;
  for_each_addressed(d.stages.by_name, out, [&](Session& stage, const RulesBatch& batch) {
    if (!stage.board.mapped() || !stage.has_info) return;
    auto [plan, added] = plans.try_emplace(batch.identity());
    if (added) plan->second = board_plan(batch.value());
    if (!plan->second || !write_board(stage, *plan->second, scratch)) return;
    board_written(stage, decided);
  });
}

void PolicyStep::board_written(const Session& stage, std::int64_t decided) {
  ++board_writes;
  board_propagation.add_ns(now_ns() - decided);
  if (d.observer) d.observer->board_written(stage.name, decided);
}

std::size_t PolicyStep::send_rules(const PolicyOutput& out, std::int64_t decided) {
  // A policy often sends the same batch to many stages (static does). Each
  // distinct batch is serialised once and its bytes shared by the frames of
  // every stage that gets it: the N-th stage's rules then leave after N small
  // frame heads rather than after N serialisations. Batches are told apart by
  // identity (RulesBatch), not by comparing their contents.
  std::unordered_map<const void*, std::shared_ptr<const std::string>> serialised;
  std::size_t sent = 0;
  for_each_addressed(d.stages.by_name, out, [&](Session& stage, const RulesBatch& batch) {
    auto [text, added] = serialised.try_emplace(batch.identity());
    if (added) text->second = std::make_shared<const std::string>(wire::dump(batch.value()));
    ++sent;
    send_rules_to(stage, text->second, decided, /*in_step=*/true);
  });
  return sent;
}

void PolicyStep::send_rules_to(Session& stage, const std::shared_ptr<const std::string>& batch_json,
                               std::int64_t decided, bool in_step) {
  const std::uint64_t id = stage.next_id++;
  char head[wire::kRulesFrameHeadMax];
  const std::size_t n =
      wire::write_rules_frame_head(id, decided, batch_json->size(), head, d.opt.max_frame);
  if (n == 0) {  // the stage would refuse the frame and close
    spdlog::warn(
        "rules for stage '{}' not sent: a batch of {} bytes exceeds the frame size "
        "limit ({} bytes)",
        stage.name, batch_json->size(), d.opt.max_frame);
    return;
  }
  stage.step_rules.push_back({id, decided});
  if (!in_step) {
    stage.send_parts(std::string_view(head, n), batch_json, "}");
    return;
  }
  ++unanswered;
  if (d.observer) d.observer->rules_writing(stage.name, decided);
  stage.send_parts(std::string_view(head, n), batch_json, "}");
  if (d.observer) d.observer->rules_written(stage.name, decided);
}

void PolicyStep::write_report() {
  if (!report_log) return;
  const double unix_time =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string line =
      json{{"unix_time", unix_time}, {"policy", doc.policy}, {"report", last_report}}.dump() + "\n";
  if (std::fputs(line.c_str(), report_log.get()) < 0 || std::fflush(report_log.get()) != 0) {
    spdlog::error("report log {}: {}; no longer writing it", d.opt.report_log,
                  std::strerror(errno));
    report_log.reset();
  }
}

// ---------------------------------------------------------------------------
// A new stage's first rules, and the answers to the policy's rules.

void PolicyStep::send_first_rules(const std::shared_ptr<Session>& s) {
  RulesBatch batch;
  const std::int64_t now = now_ns();
  if (policy) {
    PolicyInput in;
    in.now_ns = now;
    in.interval_ns = std::int64_t{interval_ms} * 1'000'000;
    in.started_ns = d.started_ns;
    in.stages.push_back(view_of(*s));
    try {
      batch = policy->admit(in);
    } catch (const std::exception& e) {
      spdlog::error("policy '{}' admitting stage '{}' failed: {}", policy->name(), s->name,
                    e.what());
    }
  }
  // Its tunables go to its board first, as a step's do.
  if (!batch.value().is_null() && s->board.mapped() && s->has_info) {
    std::vector<BoardWrite> scratch;
    if (auto plan = board_plan(batch.value()); plan && write_board(*s, *plan, scratch)) {
      board_written(*s, now);
    }
  }
  const json& rules =
      batch.value().is_null() ? json{{"version", 1}, {"rules", json::array()}} : batch.value();
  send_rules_to(*s, std::make_shared<const std::string>(wire::dump(rules)), now,
                /*in_step=*/false);
}

bool PolicyStep::on_answer(Session& s, const wire::Message& msg) {
  auto it = s.step_rules.begin();
  while (it != s.step_rules.end() && it->id != msg.id) ++it;  // the first, but for a stray answer
  if (it == s.step_rules.end()) return false;
  const std::int64_t decided = it->decided_ns;
  if (it->overdue) {
    ++late_answers;
    spdlog::info("stage '{}' answered the policy's rules {} ms after they were sent", s.name,
                 (now_ns() - decided) / 1'000'000);
  }
  s.step_rules.erase(it);
  if (decided == decided_ns && unanswered > 0 && --unanswered == 0 && d.observer) {
    d.observer->step_answered(decided);
  }
  if (msg.type == wire::Type::kAck) {
    propagation.add_ns(now_ns() - decided);
  } else {
    ++s.rules_refused;
    d.peer_log(spdlog::level::warn, "rules_rejected", "stage '{}' rejected the policy's rules: {}",
               s.name, wire::error_status(msg.body).message());
  }
  return true;
}

void PolicyStep::expire(Session& s, std::int64_t now) {
  const std::int64_t timeout_ns = ns_of(d.opt.forward_timeout);
  for (StepRules& r : s.step_rules) {
    if (r.overdue || r.decided_ns + timeout_ns > now) continue;
    r.overdue = true;
    spdlog::info(
        "stage '{}' has not answered the policy's rules in {} ms: they apply when it "
        "resumes reading",
        s.name, d.opt.forward_timeout.count());
  }
  while (s.step_rules.size() > kMaxOverdue && s.step_rules.front().overdue) {
    s.step_rules.pop_front();
  }
}

void PolicyStep::on_closed(Session& s) {
  if (s.step_rules.empty()) return;
  spdlog::debug("stage '{}' disconnected before applying {} rules batch(es)", s.name,
                s.step_rules.size());
  s.step_rules.clear();
}

}  // namespace sluice::control
