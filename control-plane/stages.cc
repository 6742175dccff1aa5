// Stage sessions and collect rounds: a stage's hello (its name, labels,
// description and board), where each message a session sends goes, and the
// collect round every interval, whose answers (statistics, and descriptions
// when they changed) feed the policy step.
#include <algorithm>

#include "daemon_impl.h"

namespace sluice::control {

using nlohmann::json;

namespace {

bool no_stats(const StageStats& s) {
  return s.collected_at_ns == 0 && s.interval_ns == 0 && s.channels.empty() && s.total.ops == 0 &&
         s.unclassified.ops == 0;
}

// Adds `later`, a stage's statistics for the interval after those in `into`,
// to `into`: answers that came after their collect was given up on are
// counted, not dropped. Objects' states are the later ones.
void add_stats(StageStats& into, StageStats&& later) {
  if (no_stats(into)) {
    into = std::move(later);
    return;
  }
  into.interval_ns += later.interval_ns;
  into.collected_at_ns = later.collected_at_ns;
  into.total.add(later.total);
  into.unclassified.add(later.unclassified);
  for (ChannelStats& c : later.channels) {
    auto ch = std::find_if(into.channels.begin(), into.channels.end(),
                           [&](const ChannelStats& x) { return x.name == c.name; });
    if (ch == into.channels.end()) {
      into.channels.push_back(std::move(c));
      continue;
    }
    ch->total.add(c.total);
    for (const auto& [n, v] : c.by_origin) ch->by_origin[n].add(v);
    ch->wait.add(c.wait);
    for (ObjectStats& o : c.objects) {
      auto obj = std::find_if(ch->objects.begin(), ch->objects.end(),
                              [&](const ObjectStats& x) { return x.name == o.name; });
      if (obj == ch->objects.end()) {
        ch->objects.push_back(std::move(o));
        continue;
      }
      obj->total.add(o.total);
      for (const auto& [n, v] : o.by_origin) obj->by_origin[n].add(v);
      obj->wait.add(o.wait);
      obj->cancelled += o.cancelled;
      obj->rejected += o.rejected;
      obj->type = std::move(o.type);
      obj->state = std::move(o.state);
    }
  }
}

// Whether `info`, from a stage's collect answer, describes what the daemon
// already holds for it. A stage's description changes only with its rules
// version, which every applied batch bumps, so an answer with the version the
// daemon last parsed is not parsed again (most answers, between rule changes).
bool same_description(const Session& s, const json& info) {
  if (!s.has_info || !info.is_object()) return false;
  auto v = info.find("rules_version");
  return v != info.end() && v->is_number_unsigned() &&
         v->get<std::uint64_t>() == s.info.rules_version;
}

// Takes the description in `info` for `s`, when it is one.
void take_description(Session& s, json&& info) {
  auto inf = stage_info_from_json(info);
  if (inf) {
    s.info = std::move(*inf);
    s.info_json = std::move(info);
    s.has_info = true;
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Stages.

void Stages::handle(const std::shared_ptr<Session>& s, const std::string& payload) {
  std::uint64_t id = 0;
  auto m = wire::parse_message(payload, &id);
  if (!m) {
    d.peer_log(spdlog::level::debug, "invalid_message", "session {}: invalid message: {}", s->sid,
               m.status().message());
    s->send(wire::make_error(id, m.status()));
    return;
  }
  switch (m->type) {
    case wire::Type::kAck:
    case wire::Type::kError:
    case wire::Type::kStats: {
      if (s->collect_id != 0 && m->id == s->collect_id) {
        d.rounds.on_answer(*s, *m);
        return;
      }
      if (!s->late_collects.empty() && d.rounds.on_late_answer(*s, *m)) return;
      if (d.step.on_answer(*s, *m)) return;
      if (d.requests.on_forward_answer(*s, *m)) return;
      d.peer_log(spdlog::level::debug, "unexpected_answer", "session {}: unexpected {} for id {}",
                 s->sid, wire::type_name(m->type), m->id);
      return;  // a reply is never answered
    }
    case wire::Type::kHello:
      hello(s, *m);
      return;
    case wire::Type::kRules:
    case wire::Type::kCollect:
      s->send(wire::make_error(
          m->id, Status::invalid("'" + std::string(wire::type_name(m->type)) +
                                 "' is sent by the daemon to stages, not to the daemon")));
      return;
    default:
      d.requests.handle(s, *m);
      return;
  }
}

void Stages::hello(const std::shared_ptr<Session>& s, const wire::Message& m) {
  if (s->is_stage) {
    s->send(wire::make_error(
        m.id, Status::precondition("hello: already registered as stage '" + s->name + "'")));
    return;
  }
  const json& b = m.body;
  std::string base = b.at("name").get<std::string>();
  // A stage of a uid that is not an administrator's is named "<name>@<uid>":
  // the names an administrator's rules and policies select ("db") are the
  // administrators' own, and no admitted uid can take one first.
  const bool qualified = !d.conns.access.is_admin(s->cred.uid);
  if (qualified) base += "@" + std::to_string(s->cred.uid);
  if (!valid_stage_name(base)) {
    s->send(wire::make_error(
        m.id, Status::invalid("hello: field 'name': " + std::string(kStageNameRule) +
                              (qualified ? " once '@<uid>' is appended (the stage of a uid "
                                           "that is not an administrator's)"
                                         : ""))));
    return;
  }
  std::string name = base;
  for (int n = 2; by_name.count(name); ++n) name = base + "-" + std::to_string(n);
  s->is_stage = true;
  s->name = name;
  s->claimed_pid = b.at("pid").get<std::int64_t>();
  if (auto it = b.find("labels"); it != b.end()) {
    for (auto& [k, v] : it->items()) s->labels[k] = v.get<std::string>();
  }
  s->connected_at_ns = now_ns();
  if (auto it = b.find("info"); it != b.end()) take_description(*s, json(*it));
  if (auto it = b.find("board"); it != b.end()) map_board(*s, *it);
  by_name[name] = s;
  d.peer_log(spdlog::level::info, "stage_connected", "stage '{}' connected (pid {}, uid {}{})",
             name, s->cred.pid, s->cred.uid, s->board.mapped() ? ", board" : "");
  s->send(wire::make_ack(
      m.id,
      json{{"name", name}, {"interval_ms", d.step.interval_ms}, {"board", s->board.mapped()}}));
  // Then, before anything else, its first rules: the stage holds its first
  // enforced request until they are in (docs/protocol.md).
  d.step.send_first_rules(s);
}

// `offer` was validated by wire::parse_message. A board that is not one (no
// descriptor, another layout or size, not a sealed memfd) is refused with a
// warning; the stage is served by messages.
void Stages::map_board(Session& s, const json& offer) {
  const std::string why = [&]() -> std::string {
    if (s.offered_fd < 0) return "no descriptor came with the hello";
    if (offer.at("layout").get<std::int64_t>() != kBoardLayoutVersion) {
      return "layout " + offer.at("layout").dump() + ", this daemon maps layout " +
             std::to_string(kBoardLayoutVersion);
    }
    auto w = BoardWriter::map(s.offered_fd);
    if (!w.is_ok()) return w.status().message();
    s.board = std::move(w).value();
    return {};
  }();
  if (!why.empty()) {
    d.peer_log(spdlog::level::warn, "board_refused",
               "stage '{}': board refused: {}; sending it messages only", s.name, why);
  }
}

void Stages::on_closed(Session& s) {
  auto it = by_name.find(s.name);
  if (it != by_name.end() && it->second.get() == &s) by_name.erase(it);
  departed.push_back(s.name);
  d.peer_log(spdlog::level::info, "stage_disconnected", "stage '{}' disconnected", s.name);
}

json Stages::summary(const Session& s, std::int64_t now) const {
  json labels = json::object();
  for (auto& [k, v] : s.labels) labels[k] = v;
  return json{{"name", s.name},
              {"pid", s.cred.pid},
              {"uid", s.cred.uid},
              {"labels", std::move(labels)},
              {"connected_at_ns", s.connected_at_ns},
              {"uptime_s", static_cast<double>(now - s.connected_at_ns) / 1e9},
              {"rules_version", s.info.rules_version},
              {"channels", s.info.channels.size()},
              {"board", s.board.mapped()},
              {"unanswered_rules", s.step_rules.size() + s.forwards.size()}};
}

// ---------------------------------------------------------------------------
// Collect rounds.

CollectRounds::CollectRounds(Daemon::Impl& daemon)
    : d(daemon), tick_timer(daemon.io), round_timer(daemon.io) {}

void CollectRounds::start() {
  next_tick = std::chrono::steady_clock::now() + std::chrono::milliseconds(d.step.interval_ms);
  schedule_tick();
}

void CollectRounds::schedule_tick() {
  tick_timer.expires_at(next_tick);
  tick_timer.async_wait([this](boost::system::error_code ec) {
    if (ec || d.stopped) return;
    tick();
  });
}

void CollectRounds::tick() {
  const int interval_ms = d.step.interval_ms;
  auto interval = std::chrono::milliseconds(interval_ms);
  next_tick += interval;
  auto now_tp = std::chrono::steady_clock::now();
  if (next_tick <= now_tp) next_tick = now_tp + interval;
  schedule_tick();
  d.step.free_last();
  if (round_open) finish_round();

  const std::int64_t now = now_ns();
  std::vector<std::shared_ptr<Session>> list;
  list.reserve(d.stages.by_name.size());
  for (auto& [name, s] : d.stages.by_name) list.push_back(s);
  for (auto& s : list) {
    // Requests past their deadline. The rules stay on the stage's connection
    // (nothing can take them back), so they are pending, not failed.
    d.requests.expire(*s, now);
    if (s->closed) continue;
    d.step.expire(*s, now);
    if (s->collect_id != 0) {
      // Given up on for this round, but its answer is still taken when it
      // comes: it may carry the stage's new description, sent only once.
      s->late_collects.push_back(s->collect_id);
      if (s->late_collects.size() > kMaxOverdue) s->late_collects.pop_front();
      s->collect_id = 0;
      if (++s->missed >= d.opt.max_missed) {
        spdlog::warn("stage '{}' missed {} collect(s); dropping it", s->name, s->missed);
        ++dropped_missed;
        s->close();
      }
    }
  }

  ++round;
  round_open = true;
  round_start_ns = now;
  outstanding = 0;
  // Sending may close a session (queue overflow), which edits the stages.
  list.clear();
  for (auto& [name, s] : d.stages.by_name) list.push_back(s);
  for (auto& s : list) {
    if (s->closed) continue;
    std::uint64_t id = s->next_id++;
    s->collect_id = id;
    ++outstanding;
    s->send(wire::make_message(wire::Type::kCollect, id));
  }
  if (outstanding <= 0) {
    finish_round();
    return;
  }
  round_timer.expires_after(std::chrono::milliseconds(std::max(1, interval_ms * 8 / 10)));
  round_timer.async_wait([this, r = round](boost::system::error_code ec) {
    if (ec || d.stopped) return;
    if (round_open && round == r) finish_round();
  });
}

void CollectRounds::finish_round() {
  round_open = false;
  round_timer.cancel();
  ++rounds_done;
  round_time.add_ns(now_ns() - round_start_ns);
  if (d.observer) d.observer->round_finished(round_start_ns);
  d.step.run();
}

void CollectRounds::on_answer(Session& s, wire::Message& msg) {
  s.collect_id = 0;
  s.missed = 0;
  s.late_collects.clear();  // answers come in order: the earlier ones came or never will
  take_answer(s, msg);
  // collect_id is the current round's: a new round forgets unanswered ones.
  if (round_open && --outstanding <= 0) finish_round();
}

bool CollectRounds::on_late_answer(Session& s, wire::Message& msg) {
  auto it = std::find(s.late_collects.begin(), s.late_collects.end(), msg.id);
  if (it == s.late_collects.end()) return false;
  s.late_collects.erase(s.late_collects.begin(), it + 1);
  ++late_answers;
  take_answer(s, msg);
  return true;
}

void CollectRounds::take_answer(Session& s, wire::Message& msg) {
  if (msg.type == wire::Type::kError) {  // e.g. an answer too large for a frame
    d.peer_log(spdlog::level::warn, "collect_failed", "stage '{}' could not answer a collect: {}",
               s.name, wire::error_status(msg.body).message());
    return;
  }
  if (msg.type != wire::Type::kStats) return;
  // The parts kept are moved out of the answer, not copied: every answer of
  // every round passes here.
  json& b = msg.body;
  if (auto it = b.find("stats"); it != b.end()) {
    auto st = stage_stats_from_json(*it);
    if (st) {
      add_stats(s.stats, std::move(*st));  // late answers may have left some
      s.last_stats_json = std::move(*it);
    } else {
      spdlog::debug("stage '{}': bad stats: {}", s.name, st.status().message());
    }
  }
  if (auto it = b.find("info"); it != b.end() && !same_description(s, *it)) {
    take_description(s, std::move(*it));
  }
}

void CollectRounds::on_closed(Session& s) {
  const bool was_outstanding = s.collect_id != 0;
  s.collect_id = 0;
  if (was_outstanding && round_open && --outstanding <= 0) {
    asio::post(d.io, [this, r = round] {
      if (round_open && round == r && outstanding <= 0) finish_round();
    });
  }
}

}  // namespace sluice::control
