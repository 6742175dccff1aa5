// Clients' requests: list_stages, get_stats, apply_rules (forwarded to the
// stage, and answered when it answers, or `pending` when it does not in
// time), policy_show (with the daemon's own metrics) and policy_set; who may
// make each is access.h's to say.
#include "client.h"
#include "daemon_impl.h"

namespace sluice::control {

using nlohmann::json;

void Requests::handle(const std::shared_ptr<Session>& s, const wire::Message& m) {
  const std::int64_t now = now_ns();
  const json& b = m.body;
  switch (m.type) {
    case wire::Type::kListStages: {
      json list = json::array();
      for (auto& [name, st] : d.stages.by_name) list.push_back(d.stages.summary(*st, now));
      s->send(wire::make_ack(m.id, json{{"stages", std::move(list)}}));
      return;
    }
    case wire::Type::kGetStats: {
      std::string only = b.value("stage", std::string());
      if (!only.empty() && !d.stages.by_name.count(only)) {
        s->send(wire::make_error(m.id, Status::not_found("no stage named '" + only + "'")));
        return;
      }
      json list = json::array();
      for (auto& [name, st] : d.stages.by_name) {
        if (!only.empty() && name != only) continue;
        json e = d.stages.summary(*st, now);
        e["stats"] = st->last_stats_json;
        e["info"] = st->info_json;
        const ProcIo& pio = st->io_last;
        e["io"] = json{{"valid", pio.valid},
                       {"read_bytes", pio.read_bytes},
                       {"write_bytes", pio.write_bytes},
                       {"rchar", pio.rchar},
                       {"wchar", pio.wchar},
                       {"delta_read_bytes", pio.delta_read_bytes},
                       {"delta_write_bytes", pio.delta_write_bytes}};
        list.push_back(std::move(e));
      }
      s->send(wire::make_message(
                  wire::Type::kStats, m.id,
                  json{{"interval_ms", d.step.interval_ms}, {"stages", std::move(list)}}),
              kMaxReplyBytes);
      return;
    }
    case wire::Type::kApplyRules:
      apply_rules(s, m);
      return;
    case wire::Type::kPolicyShow: {
      const PolicyStep& p = d.step;
      json describe = p.policy ? p.policy->describe() : json();
      s->send(wire::make_ack(m.id, json{{"policy", p.doc.policy},
                                        {"interval_ms", p.interval_ms},
                                        {"source", p.source},
                                        {"config", p.doc.config},
                                        {"describe", std::move(describe)},
                                        {"report", p.last_report},
                                        {"policies", policy_names()},
                                        {"metrics", metrics()}}));
      return;
    }
    case wire::Type::kPolicySet: {
      if (Status allowed = authorize(d.conns.access, s->cred.uid, Action::kSetPolicy);
          !allowed.is_ok()) {
        deny(*s, m.id, allowed);
        return;
      }
      auto doc = parse_policy_doc(b.at("policy"), /*from_wire=*/true);
      if (!doc) {
        s->send(wire::make_error(m.id, doc.status().with_prefix("policy_set: ")));
        return;
      }
      std::string name = doc->policy;
      Status st =
          d.step.install(std::move(*doc), "socket (uid " + std::to_string(s->cred.uid) + ")");
      if (!st.is_ok()) {
        s->send(wire::make_error(m.id, st.with_prefix("policy_set: ")));
        return;
      }
      s->send(wire::make_ack(m.id, json{{"policy", name}, {"interval_ms", d.step.interval_ms}}));
      return;
    }
    default:
      s->send(wire::make_error(m.id, Status::invalid("'" + std::string(wire::type_name(m.type)) +
                                                     "' is not a request the daemon serves")));
      return;
  }
}

void Requests::deny(Session& s, std::uint64_t id, const Status& why) {
  ++d.conns.counts.denied;
  d.peer_log(spdlog::level::warn, "denied", "session {} (pid {}): {}", s.sid, s.cred.pid,
             why.message());
  s.send(wire::make_error(id, why));
}

void Requests::apply_rules(const std::shared_ptr<Session>& s, const wire::Message& m) {
  const std::int64_t now = now_ns();
  const json& b = m.body;
  std::string target = b.at("stage").get<std::string>();
  auto it = d.stages.by_name.find(target);
  if (it == d.stages.by_name.end()) {
    s->send(wire::make_error(m.id, Status::not_found("no stage named '" + target + "'")));
    return;
  }
  if (Status allowed =
          authorize(d.conns.access, s->cred.uid, Action::kApplyRules, target, it->second->cred.uid);
      !allowed.is_ok()) {
    deny(*s, m.id, allowed);
    return;
  }
  ++s->awaiting;
  std::weak_ptr<Session> client = s;
  std::uint64_t req = m.id;
  auto reply = [client, req, target](const wire::Message* msg, const Status& st) {
    auto c = client.lock();
    if (c) --c->awaiting;
    if (!c || c->closed) return;
    if (msg && msg->type == wire::Type::kAck) {
      c->send(wire::make_ack(
          req, json{{"stage", target},
                    {"rules_version", msg->body.value("rules_version", std::uint64_t{0})}}));
    } else if (msg) {
      c->send(wire::make_error(
          req, wire::error_status(msg->body).with_prefix("stage '" + target + "': ")));
    } else {
      c->send(wire::make_error(req, st));
    }
  };
  std::shared_ptr<Session> stage = it->second;  // sending may close it
  const std::uint64_t fid = stage->next_id++;
  wire::SharedFrame frame;
  Status made = wire::make_rules_frame(
      fid, now, std::make_shared<const std::string>(wire::dump(b.at("rules"))), frame,
      d.opt.max_frame);
  if (!made.is_ok()) {  // the stage would refuse the frame and close
    reply(nullptr, made.with_prefix("rules for stage '" + target + "': "));
    return;
  }
  Forward f;
  f.deadline_ns = now + ns_of(d.opt.forward_timeout);
  f.sent_ns = now;
  f.frame_end = stage->queued_bytes + frame.size();
  f.uid = s->cred.uid;
  f.done = std::move(reply);
  stage->forwards.emplace(fid, std::move(f));
  stage->send_frame(std::move(frame));
}

bool Requests::on_forward_answer(Session& s, const wire::Message& m) {
  auto it = s.forwards.find(m.id);
  if (it == s.forwards.end()) return false;
  Forward f = std::move(it->second);
  s.forwards.erase(it);
  if (!f.overdue) {
    if (f.done) f.done(&m, Status::ok());
    return true;
  }
  // The requester was told "pending": this is how it ended.
  ++late_answers;
  const std::int64_t ms = (now_ns() - f.sent_ns) / 1'000'000;
  if (m.type == wire::Type::kAck) {
    spdlog::info(
        "stage '{}' applied rules from uid {} {} ms after they were sent "
        "(rules_version {})",
        s.name, f.uid, ms, m.body.value("rules_version", std::uint64_t{0}));
  } else {
    spdlog::warn("stage '{}' refused rules from uid {} {} ms after they were sent: {}", s.name,
                 f.uid, ms, wire::error_status(m.body).message());
  }
  return true;
}

void Requests::expire(Session& s, std::int64_t now) {
  std::size_t overdue = 0;
  // Answered after the walk: answering may close a session, the stage's own
  // included (a stage may forward rules to itself), which clears s.forwards.
  std::vector<std::pair<std::function<void(const wire::Message*, const Status&)>, Status>> due;
  for (auto& [id, f] : s.forwards) {
    if (f.overdue) {
      ++overdue;
      continue;
    }
    if (f.deadline_ns > now) continue;
    f.overdue = true;
    ++overdue;
    if (!f.done) continue;
    const std::string waited = std::to_string(d.opt.forward_timeout.count()) + " ms";
    due.emplace_back(
        std::move(f.done),
        Status::pending(
            s.written_bytes >= f.frame_end
                ? "stage '" + s.name + "' has not answered in " + waited +
                      " (stopped or busy?): the rules reached it and it applies them when it "
                      "resumes reading, unless it exits first; its rules_version in `sluice "
                      "stages` moves when it has"
                : "stage '" + s.name + "' has not answered in " + waited +
                      " nor read the rules (stopped or busy?): they are queued for it and "
                      "applied when it resumes reading, unless it disconnects first"));
    f.done = nullptr;
  }
  for (auto it = s.forwards.begin(); overdue > kMaxOverdue && it != s.forwards.end();) {
    if (!it->second.overdue) {
      ++it;
      continue;
    }
    it = s.forwards.erase(it);  // its late answer will be ignored
    --overdue;
  }
  for (auto& [done, status] : due) done(nullptr, status);
}

void Requests::on_closed(Session& s) {
  auto forwards = std::move(s.forwards);
  s.forwards.clear();
  for (auto& [id, f] : forwards) {
    // A frame the stage's connection had taken is in its receive queue: a
    // stage dropped while stopped reads and applies it when it resumes.
    const bool delivered = s.written_bytes >= f.frame_end;
    if (f.overdue) {
      spdlog::info("stage '{}' disconnected without answering rules from uid {}{}", s.name, f.uid,
                   delivered ? " (they had reached it: it may have applied them)" : "");
    } else if (f.done) {
      f.done(nullptr, delivered ? Status::pending("stage '" + s.name +
                                                  "' disconnected before answering, after the "
                                                  "rules reached it: it may apply them (a "
                                                  "stopped stage does when it resumes); its "
                                                  "rules_version tells once it reconnects")
                                : Status::unavailable("stage '" + s.name +
                                                      "' disconnected before the rules reached "
                                                      "it: not applied"));
    }
  }
}

// Counters and constant-size summaries only: what the daemon keeps of itself
// costs nothing per step but a few additions.
json Requests::metrics() const {
  return json{{"rounds", d.rounds.rounds_done},
              {"stages", d.stages.by_name.size()},
              {"sessions", d.conns.sessions.size()},
              {"dropped_missed", d.rounds.dropped_missed},
              {"late_collect_answers", d.rounds.late_answers},
              {"late_rules_answers", d.step.late_answers + late_answers},
              {"collect_round_us", d.rounds.round_time.to_json()},
              {"propagation_us", d.step.propagation.to_json()},
              {"board_writes", d.step.board_writes},
              {"board_propagation_us", d.step.board_propagation.to_json()},
              {"connections", d.conns.metrics()},
              {"log_lines", d.logs.counts()}};
}

}  // namespace sluice::control
