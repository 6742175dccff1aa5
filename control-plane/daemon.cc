// The control-plane daemon: sessions, the control loop, policy management.
// GCC 12 reports false positives inside Asio's and nlohmann's headers after
// inlining; they are not in our code.
// Under -fsanitize=thread GCC also flags Asio's atomic_thread_fence (-Wtsan).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wnull-dereference"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wtsan"
#endif

#include "daemon.h"

#include "access.h"
#include "log_limiter.h"
#include "session_arena.h"
#include "sluice/board.h"

#include <fcntl.h>
#include <grp.h>
#include <malloc.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

#include <spdlog/spdlog.h>
#include <boost/asio.hpp>

namespace sluice::control {

namespace asio = boost::asio;
using stream = asio::local::stream_protocol;
using nlohmann::json;

namespace {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// CPU time the calling thread has used (ns).
std::int64_t thread_cpu_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// Upper bound on bytes queued for one peer; a peer that does not read is
// disconnected rather than allowed to grow the daemon without bound.
constexpr std::size_t kMaxQueuedBytes = 64u << 20;
// Replies to client requests may be this large (the CLI decodes up to it).
constexpr std::size_t kMaxClientReply = 32u << 20;
// Latency samples kept for `policy show` metrics.
constexpr std::size_t kMaxSamples = 8192;
// Requests a stage has left unanswered past their deadline whose late answers
// the daemon still takes (per stage and kind; the oldest are forgotten first).
constexpr std::size_t kMaxOverdue = 256;

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  auto idx = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(idx, v.size() - 1)];
}

void push_sample(std::deque<double>& d, double x) {
  d.push_back(x);
  if (d.size() > kMaxSamples) d.pop_front();
}

json summary(const std::deque<double>& d) {
  std::vector<double> v(d.begin(), d.end());
  return json{{"count", v.size()},
              {"p50", percentile(v, 0.5)},
              {"p99", percentile(v, 0.99)},
              {"max", v.empty() ? 0.0 : *std::max_element(v.begin(), v.end())}};
}

// Refuses keys naming files or paths anywhere in a policy configuration that
// arrived over the socket.
Status check_no_paths(const json& j, const std::string& where) {
  if (j.is_object()) {
    for (auto& [k, v] : j.items()) {
      auto ends = [&](std::string_view suf) {
        return k.size() >= suf.size() && k.compare(k.size() - suf.size(), suf.size(), suf) == 0;
      };
      if (ends("_file") || ends("_path") || k == "file" || k == "path") {
        return Status::invalid(where + "." + k +
                               ": path-valued settings are not accepted over the socket "
                               "(`sluice policy set` inlines rules files)");
      }
      SLUICE_RETURN_IF_ERROR(check_no_paths(v, where + "." + k));
    }
  } else if (j.is_array()) {
    for (std::size_t i = 0; i < j.size(); ++i) {
      SLUICE_RETURN_IF_ERROR(check_no_paths(j[i], where + "[" + std::to_string(i) + "]"));
    }
  }
  return Status::ok();
}

std::string dir_of(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
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

}  // namespace

// ---------------------------------------------------------------------------
// Policy documents.

StatusOr<PolicyDoc> parse_policy_doc(const json& doc, bool from_wire, const std::string& base_dir) {
  if (!doc.is_object()) return Status::invalid("policy: expected a JSON object");
  PolicyDoc p;
  for (auto& [k, v] : doc.items()) {
    if (k == "policy") {
      if (!v.is_string() || v.get_ref<const std::string&>().empty()) {
        return Status::invalid("policy: expected a policy name");
      }
      p.policy = v.get<std::string>();
    } else if (k == "interval_ms") {
      if (!v.is_number_integer() || v.get<std::int64_t>() < 1 ||
          v.get<std::int64_t>() > 3600 * 1000) {
        return Status::invalid("interval_ms: expected an integer in 1..3600000");
      }
      p.interval_ms = v.get<int>();
    } else if (k == "config") {
      if (!v.is_object()) return Status::invalid("config: expected an object");
      p.config = v;
    } else if (k == "version" || k == "comment") {
      // accepted, ignored
    } else {
      return Status::invalid(k + ": unknown field (expected policy, interval_ms, config)");
    }
  }
  if (from_wire) {
    SLUICE_RETURN_IF_ERROR(check_no_paths(p.config, "config"));
  } else if (auto it = p.config.find("rules_file");
             it != p.config.end() && it->is_string() && !base_dir.empty()) {
    std::string f = it->get<std::string>();
    if (!f.empty() && f[0] != '/') *it = base_dir + "/" + f;
  }
  return p;
}

StatusOr<PolicyDoc> load_policy_file(const std::string& path) {
  auto text = read_rules_file(path);
  if (!text) return text.status();
  json doc;
  try {
    doc = json::parse(*text);
  } catch (const json::parse_error& e) {
    return Status::invalid(path + ": malformed JSON at byte " + std::to_string(e.byte));
  } catch (const json::exception& e) {  // a number out of range
    return Status::invalid(path + ": malformed JSON: " + e.what());
  }
  auto p = parse_policy_doc(doc, false, dir_of(path));
  if (!p) return p.status().with_prefix(path + ": ");
  return p;
}

Status inline_rules_files(json& doc, const std::string& base_dir) {
  if (!doc.is_object()) return Status::invalid("policy: expected a JSON object");
  auto c = doc.find("config");
  if (c == doc.end() || !c->is_object()) return Status::ok();
  auto f = c->find("rules_file");
  if (f == c->end()) return Status::ok();
  if (!f->is_string()) return Status::invalid("config.rules_file: expected a path");
  std::string path = f->get<std::string>();
  if (!path.empty() && path[0] != '/') path = base_dir + "/" + path;
  auto text = read_rules_file(path);
  if (!text) return text.status().with_prefix("config.rules_file: ");
  try {
    (*c)["rules"] = json::parse(*text);
  } catch (const json::parse_error& e) {
    return Status::invalid("config.rules_file: " + path + ": malformed JSON at byte " +
                           std::to_string(e.byte));
  } catch (const json::exception& e) {  // a number out of range
    return Status::invalid("config.rules_file: " + path + ": malformed JSON: " + e.what());
  }
  c->erase("rules_file");
  return Status::ok();
}

// ---------------------------------------------------------------------------
// /proc.

ProcIo read_proc_io(std::int64_t pid) {
  ProcIo io;
  if (pid <= 0) return io;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%lld/io", static_cast<long long>(pid));
  std::FILE* f = std::fopen(path, "re");
  if (!f) return io;
  char key[64];
  unsigned long long v = 0;
  int found = 0;
  while (std::fscanf(f, "%63[^:]: %llu\n", key, &v) == 2) {
    std::string_view k(key);
    if (k == "rchar")
      io.rchar = v, ++found;
    else if (k == "wchar")
      io.wchar = v, ++found;
    else if (k == "read_bytes")
      io.read_bytes = v, ++found;
    else if (k == "write_bytes")
      io.write_bytes = v, ++found;
  }
  std::fclose(f);
  io.valid = found == 4;
  return io;
}

std::string default_socket_path() {
  if (const char* s = std::getenv("SLUICE_SOCKET"); s && *s) return s;
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x) {
    return std::string(x) + "/sluice.sock";
  }
  return "/tmp/sluice-" + std::to_string(::getuid()) + ".sock";
}

// ---------------------------------------------------------------------------
// Sessions.

struct Session;

// A policy's rules batch sent to a stage and not answered yet.
struct StepRules {
  std::uint64_t id = 0;
  std::int64_t decided_ns = 0;
  bool overdue = false;  // unanswered past forward_timeout (logged once)
};

// A client's apply_rules request forwarded to a stage and not answered yet.
// Past its deadline the requester is told it is pending (Code::kPending) and
// the record stays, overdue, so that the stage's late answer is still taken
// (and logged) rather than mistaken for nothing.
struct Forward {
  std::int64_t deadline_ns = 0;
  std::int64_t sent_ns = 0;
  // The stage's connection has delivered the frame once its written_bytes
  // reach this (Session::queued_bytes, counted with the frame).
  std::uint64_t frame_end = 0;
  std::uint32_t uid = 0;  // the requester's
  bool overdue = false;
  // msg is null when the stage gave no answer (status says why).
  std::function<void(const wire::Message* msg, const Status& status)> done;
};

struct Daemon::Impl {
  explicit Impl(DaemonOptions o)
      : opt(std::move(o)), acceptor(io), tick_timer(io), round_timer(io), signals(io) {}

  DaemonOptions opt;
  asio::io_context io;
  stream::acceptor acceptor;
  asio::steady_timer tick_timer;
  asio::steady_timer round_timer;
  asio::signal_set signals;
  ino_t socket_ino = 0;

  std::map<std::uint64_t, std::shared_ptr<Session>> sessions;
  std::map<std::string, std::shared_ptr<Session>> stages;  // by unique name
  std::uint64_t next_sid = 1;

  std::unique_ptr<Policy> policy;
  std::int64_t started_ns = 0;  // run() began serving (PolicyInput::started_ns)
  PolicyDoc doc;
  std::string policy_source;
  int interval_ms = 1000;
  json last_report = json::object();
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> report_log{nullptr, &std::fclose};
  std::vector<std::string> departed;

  std::uint64_t round = 0;
  bool round_open = false;
  int outstanding = 0;
  std::int64_t round_start_ns = 0;
  std::chrono::steady_clock::time_point next_tick;
  std::uint64_t rounds_done = 0;
  std::uint64_t dropped_missed = 0;
  // Answers that came after the daemon stopped waiting for them, taken all
  // the same: to collects (their stats and descriptions), to rules.
  std::uint64_t late_collect_answers = 0;
  std::uint64_t late_rules_answers = 0;
  std::deque<double> round_us;
  std::deque<double> propagation_us;
  // Per step that sent rules: decision -> every frame built (send_build_us),
  // the writes alone (send_write_us), decision -> the last frame written.
  std::deque<double> send_build_us;
  std::deque<double> send_write_us;
  std::deque<double> send_total_us;
  std::int64_t step_write_ns = 0;  // time in send_frame during this step
  // Involuntary context switches of the loop thread while it sent a step's
  // rules: how often the stages it woke (or anything else) preempted it.
  std::deque<double> send_preempted;
  // The loop thread's CPU time from a step's decision to the last answer to
  // its rules (sending, reading the answers, and whatever else it served
  // meanwhile): what a change costs the daemon. Steps some stage never
  // answered are not counted.
  std::deque<double> rules_cpu_us;
  // Boards: per step that wrote any, the decision to the last board written
  // (board_us); per stage written, the decision to its board written
  // (board_propagation_us: the change is in effect there from then on).
  std::deque<double> board_us;
  std::deque<double> board_propagation_us;
  std::uint64_t board_writes = 0;
  std::int64_t step_decided_ns = 0;  // the step whose answers are counted
  std::size_t step_unanswered = 0;
  std::int64_t step_cpu0_ns = 0;
  // The last step's policy input and output (every stage's view and rules),
  // freed at the next tick rather than when the step returns: with 100
  // stages freeing them took 100-200 us of the loop thread, right when the
  // stages it had just woken needed the CPU to apply their rules.
  PolicyInput retired_in;
  PolicyOutput retired_out;
  bool stopped = false;

  // Who may do what (access.h), and the limits on connections (daemon.h,
  // docs/protocol.md "Limits").
  AccessRules access;
  LogLimiter logs;
  std::size_t conn_limit = 0;      // max_connections, fitted to the descriptor limit
  std::size_t buffer_budget = 0;   // max_buffered, at least a frame
  std::size_t buffered_total = 0;  // bytes of unfinished frames, all sessions
  std::set<std::uint64_t> silent;  // sessions yet to complete a frame, oldest first
  // A descriptor held so that, out of descriptors, the daemon can still
  // accept a connection to tell it so and close it.
  struct SpareFd {
    int fd = -1;
    ~SpareFd() {
      if (fd >= 0) ::close(fd);
    }
  } spare;
  std::chrono::milliseconds accept_backoff{0};
  asio::steady_timer accept_timer{io};
  asio::steady_timer sweep_timer{io};
  // Every session reads into this and keeps only what its decoder has not
  // yet returned as frames (the loop is single-threaded and a read is fed to
  // the session's decoder before the next read starts).
  std::array<char, 64 * 1024> rbuf;
  std::uint64_t closed_since_trim = 0;
  std::size_t released_since_trim = 0;
  struct {
    std::uint64_t evicted = 0;       // to make room for a newer connection
    std::uint64_t refused_full = 0;  // no room, nobody to evict
    std::uint64_t refused_uid = 0;   // not admitted
    std::uint64_t denied = 0;        // requests refused by authorize()
    std::uint64_t timed_out = 0;     // handshake, frame or idle timeout
    std::uint64_t over_budget = 0;   // closed for the unfinished-frame budget
    std::uint64_t accept_errors = 0;
  } conn_stats;

  Status install_policy(PolicyDoc d, std::string source);
  Status bind_socket();
  void start_accept();
  void on_accept(stream::socket sock);
  void schedule_tick();
  void tick();
  void finish_round();
  void run_step();
  void handle(const std::shared_ptr<Session>& s, const std::string& payload);
  // A stage's answer to its outstanding collect.
  void on_collect_answer(Session& s, wire::Message& msg);
  // A stage's answer to a collect the daemon gave up on (a new round began
  // first); false when `msg` answers none.
  bool on_late_collect_answer(Session& s, wire::Message& msg);
  // Takes the stats and the description a collect's answer carries.
  void take_collect_answer(Session& s, wire::Message& msg);
  // A stage's answer (null: the fast path's plain ack) to the step's rules
  // batch `id`; false when no such batch is outstanding.
  bool on_step_rules_answer(Session& s, std::uint64_t id, const wire::Message* msg);
  void handle_hello(const std::shared_ptr<Session>& s, const wire::Message& m);
  // A new stage's first rules frame, right after its hello's answer: what
  // the policy gives it now (Policy::admit), else an empty batch.
  void send_first_rules(const std::shared_ptr<Session>& s);
  void map_board(Session& s, const json& offer);
  void handle_client(const std::shared_ptr<Session>& s, const wire::Message& m);
  // Answers request `id` with `why` (authorize()'s refusal).
  void deny(Session& s, std::uint64_t id, const Status& why);
  void on_closed(Session& s);
  // Sends the rules batch of the step run_step is taking, already serialised
  // (wire::dump), to a stage, and counts it among the step's unanswered (not
  // `in_step`: a new stage's first rules); its answer goes to
  // on_step_rules_answer. Sending may close the session (removing it from
  // `stages`): the caller holds a reference.
  void send_step_rules(Session& stage, const std::shared_ptr<const std::string>& batch_json,
                       std::int64_t decided_ns, bool in_step = true);
  // Writes the step's tunables to the boards of the stages that have one
  // (run_step, before any frame leaves).
  void write_boards(const PolicyOutput& out, std::int64_t decided_ns);
  void shutdown();
  void wait_signal();
  json stage_summary(const Session& s, std::int64_t now) const;
  json metrics() const;

  // Limits (docs/protocol.md "Limits").
  void setup_limits();
  void on_accept_error(const boost::system::error_code& ec);
  // Out of descriptors: accepts one connection on the spare descriptor to
  // tell it so, and closes it.
  void refuse_with_spare();
  // Makes room for `s`, just accepted: false when it was refused.
  bool make_room(Session& s);
  // Closes the oldest connection that has sent nothing, else the client idle
  // longest (never a stage, never `keep`): false when there is none.
  bool evict_one(std::uint64_t keep);
  // A session completed a frame.
  void on_frame(Session& s);
  // Counts what `s` holds of an unfinished frame against the budget, closing
  // the holders of the oldest unfinished frames while it is exceeded: false
  // when that closed `s`.
  bool note_unfinished(Session& s);
  void schedule_sweep();
  // Timeouts, the log's summaries of suppressed lines, memory returned.
  void sweep();
  json connection_metrics() const;
  // Logs a line about what a peer did, within the limits of its kind
  // (log_limiter.h).
  template <typename... A>
  void peer_log(spdlog::level::level_enum level, std::string_view kind,
                fmt::format_string<A...> format, A&&... args) {
    std::uint64_t suppressed = 0;
    if (!logs.admit(kind, now_ns(), &suppressed) || !spdlog::should_log(level)) return;
    const std::string line = fmt::format(format, std::forward<A>(args)...);
    if (suppressed > 0) {
      spdlog::log(level, "{} ({} similar messages suppressed)", line, suppressed);
    } else {
      spdlog::log(level, "{}", line);
    }
  }
};

struct Session : std::enable_shared_from_this<Session> {
  Session(Daemon::Impl& daemon, stream::socket s, std::uint64_t id)
      : d(daemon), sock(std::move(s)), sid(id), decoder(daemon.opt.max_frame) {}

  Daemon::Impl& d;
  stream::socket sock;
  std::uint64_t sid;
  ucred cred{};
  wire::FrameDecoder decoder;
  std::deque<wire::SharedFrame, SessionAllocator<wire::SharedFrame>> outq;
  std::size_t out_bytes = 0;
  // Bytes of every frame ever handed to send_parts, and of those the bytes
  // the kernel has taken (in a UNIX socket: in the peer's receive queue,
  // which it reads even after the daemon closes). A frame is delivered once
  // written_bytes reaches queued_bytes as counted with it.
  std::uint64_t queued_bytes = 0;
  std::uint64_t written_bytes = 0;
  bool writing = false;
  bool closed = false;
  bool close_after_write = false;

  // Stage role (after hello).
  bool is_stage = false;
  std::string name;
  std::int64_t claimed_pid = 0;
  std::map<std::string, std::string> labels;
  std::int64_t connected_at_ns = 0;
  StageInfo info;
  json info_json = json::object();
  bool has_info = false;  // info and info_json hold a description the stage sent
  json last_stats_json;   // the latest collect's stats, for get_stats
  StageStats stats;       // not yet handed to the policy
  // Requests this session waits on answers to (ids from next_id, so never 0).
  // A stage answers in the order it was asked.
  std::uint64_t next_id = 1;
  std::uint64_t collect_id = 0;  // outstanding collect, 0: none
  std::deque<std::uint64_t, SessionAllocator<std::uint64_t>>
      late_collects;                                              // given up on, oldest first
  std::deque<StepRules, SessionAllocator<StepRules>> step_rules;  // policy batches, oldest first
  std::map<std::uint64_t, Forward> forwards;                      // clients' apply_rules
  int missed = 0;
  ProcIo io_prev;
  ProcIo io_last;
  // The board the stage handed over with its hello (mapped by handle_hello),
  // and, until the connection's first frame was handled, the descriptor that
  // came with its first bytes (-1: none).
  BoardWriter board;
  int offered_fd = -1;
  bool first_read = true;

  // Limits: when it connected and completed its last frame, when the frame
  // being read began (0: none), what of it counts in d.buffered_total.
  std::int64_t accepted_ns = 0;
  std::int64_t last_frame_ns = 0;
  std::int64_t frame_started_ns = 0;
  std::size_t counted_bytes = 0;
  bool said_anything = false;  // has completed a frame
  int awaiting = 0;            // its apply_rules requests not answered yet

  ~Session() { drop_offered_fd(); }

  void drop_offered_fd() {
    if (offered_fd >= 0) {
      ::close(offered_fd);
      offered_fd = -1;
    }
  }

  // Waits for the socket to be readable, then reads it (read_now). The
  // socket holds the bytes until then: a session has no buffer of its own
  // but its decoder's, which holds only unfinished frames.
  void start_read() {
    auto self = shared_from_this();
    sock.async_wait(stream::socket::wait_read, [self](boost::system::error_code ec) {
      if (self->closed || self->close_after_write) return;
      if (ec) {
        self->on_read(ec, 0);
        return;
      }
      self->read_now();
    });
  }

  void read_now() {
    if (closed || close_after_write) return;
    ssize_t n;
    do {
      n = receive();
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      start_read();
      return;
    }
    first_read = false;
    if (n <= 0) {
      on_read(n == 0 ? asio::error::eof
                     : boost::system::error_code(errno, boost::system::system_category()),
              0);
      return;
    }
    on_read({}, static_cast<std::size_t>(n));
  }

  // One recvmsg into the daemon's read buffer. The first bytes may carry a
  // stage's board (SCM_RIGHTS), which only recvmsg with room for it
  // receives: the first descriptor that came with them is kept in
  // offered_fd, any other closed. Later reads never take descriptors (the
  // kernel discards any that come).
  ssize_t receive() {
    iovec iov{d.rbuf.data(), d.rbuf.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (first_read) {
      mh.msg_control = control;
      mh.msg_controllen = sizeof(control);
    }
    const ssize_t n = ::recvmsg(sock.native_handle(), &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 || !first_read) return n;
    for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (offered_fd < 0) {
          offered_fd = fd;
        } else {
          ::close(fd);
        }
      }
    }
    return n;
  }

  void on_read(boost::system::error_code ec, std::size_t n) {
    if (closed) return;
    if (ec) {
      if (decoder.mid_frame()) {
        d.peer_log(spdlog::level::info, "mid_frame_close",
                   "session {}: peer disconnected mid-frame ({} bytes buffered)", sid,
                   decoder.buffered());
      }
      close();
      return;
    }
    decoder.feed(d.rbuf.data(), n);
    std::string payload;
    auto self = shared_from_this();
    for (;;) {
      Status err;
      auto r = decoder.next(&payload, &err);
      if (r == wire::FrameDecoder::Result::kNeedMore) break;
      if (r == wire::FrameDecoder::Result::kError) {
        d.peer_log(spdlog::level::warn, "bad_frame", "session {} (uid {}): {}; closing", sid,
                   cred.uid, err.message());
        refuse(err);
        return;
      }
      d.on_frame(*this);
      d.handle(self, payload);
      drop_offered_fd();  // for the first frame only: a hello has mapped it by now
      if (closed || close_after_write) return;
    }
    if (!d.note_unfinished(*this)) return;
    if (n == d.rbuf.size()) {
      // The socket may hold more; it would not wake a wait again (the
      // reactor waits for new data), so read again after the others' turn.
      asio::post(d.io, [self] { self->read_now(); });
    } else {
      start_read();
    }
  }

  // Sends `why` (an error, id 0) if the socket takes it at once, then
  // closes: a peer refused or dropped learns why, and one that does not read
  // cannot keep its connection (and its descriptor) open.
  void refuse(const Status& why) {
    if (closed) return;
    if (!writing && outq.empty()) {
      std::string frame;
      if (wire::append_frame(wire::make_error(0, why), frame, d.opt.max_frame).is_ok()) {
        (void)write_now(frame, nullptr, {});
      }
    }
    close();
  }

  // Forgets the unfinished frame (its bytes leave the budget and the memory
  // goes back).
  void drop_unfinished() {
    d.buffered_total -= counted_bytes;
    d.released_since_trim += counted_bytes;
    counted_bytes = 0;
    frame_started_ns = 0;
    decoder = wire::FrameDecoder(decoder.max_frame());
  }

  // `limit`: the largest frame to send. Stages decode with the default limit;
  // replies to clients (get_stats with many stages) may be larger.
  void send(const json& msg, std::size_t limit = 0) {
    if (closed) return;
    std::string frame;
    if (!wire::append_frame(msg, frame, limit ? limit : d.opt.max_frame).is_ok()) {
      frame.clear();
      (void)wire::append_frame(
          wire::make_error(msg.value("id", std::uint64_t{0}),
                           Status::internal("reply exceeds the frame size limit")),
          frame, d.opt.max_frame);
    }
    wire::SharedFrame f;
    f.head = std::move(frame);
    send_frame(std::move(f));
  }

  // Sends a frame (possibly sharing its bytes with other sessions' frames).
  void send_frame(wire::SharedFrame frame) {
    send_parts(frame.head, frame.shared, frame.tail, &frame);
  }

  // Sends the frame whose bytes are head, *shared (when set), tail. With
  // nothing queued it is written at once, in one non-blocking sendmsg, and
  // nothing is built or copied: the daemon sends a rules frame to every
  // stage in one step, and an async write chain (or just a frame built) per
  // stage cost more than the write itself. What the socket does not take, or
  // a failed write, is queued and goes the asynchronous way (errors then
  // close the session from the loop, never from inside this call). `owner`,
  // when given, is a frame holding these parts, moved into the queue.
  void send_parts(std::string_view head, const std::shared_ptr<const std::string>& shared,
                  std::string_view tail, wire::SharedFrame* owner = nullptr) {
    if (closed) return;
    const std::size_t size = head.size() + (shared ? shared->size() : 0) + tail.size();
    queued_bytes += size;
    std::size_t written = 0;
    if (!writing && outq.empty()) {
      written = write_now(head, shared.get(), tail);
      written_bytes += written;
      if (written == size) return;
    }
    wire::SharedFrame rest;
    if (written > 0) {  // the part the socket did not take, flattened
      std::string all(head);
      if (shared) all += *shared;
      all += tail;
      rest.head = all.substr(written);
    } else if (owner != nullptr) {
      rest = std::move(*owner);
    } else {
      rest.head.assign(head);
      rest.shared = shared;
      rest.tail.assign(tail);
    }
    out_bytes += rest.size();
    outq.push_back(std::move(rest));
    if (out_bytes > kMaxQueuedBytes) {
      d.peer_log(spdlog::level::warn, "slow_reader",
                 "session {}: peer does not read ({} bytes queued); closing", sid, out_bytes);
      close();
      return;
    }
    if (!writing) do_write();
  }

  // Writes what the socket takes without blocking; 0 on EAGAIN or an error
  // (left to the asynchronous write to report).
  std::size_t write_now(std::string_view head, const std::string* shared, std::string_view tail) {
    std::array<iovec, 3> iov{};
    std::size_t cnt = 0;
    auto add = [&](std::string_view part) {
      if (part.empty()) return;
      iov[cnt].iov_base = const_cast<char*>(part.data());
      iov[cnt].iov_len = part.size();
      ++cnt;
    };
    add(head);
    if (shared) add(*shared);
    add(tail);
    msghdr mh{};
    mh.msg_iov = iov.data();
    mh.msg_iovlen = cnt;
    for (;;) {
      ssize_t n = ::sendmsg(sock.native_handle(), &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n >= 0) return static_cast<std::size_t>(n);
      if (errno != EINTR) return 0;
    }
  }

  void do_write() {
    if (closed || outq.empty()) {
      writing = false;
      return;
    }
    writing = true;
    auto self = shared_from_this();
    const wire::SharedFrame& f = outq.front();
    std::array<asio::const_buffer, 3> bufs = {
        asio::buffer(f.head), f.shared ? asio::buffer(*f.shared) : asio::const_buffer(),
        asio::buffer(f.tail)};
    asio::async_write(sock, bufs, [self](boost::system::error_code ec, std::size_t) {
      if (self->closed) return;
      if (ec) {
        self->close();
        return;
      }
      self->out_bytes -= self->outq.front().size();
      self->written_bytes += self->outq.front().size();
      self->outq.pop_front();
      if (self->outq.empty()) {
        self->writing = false;
        if (self->close_after_write) self->close();
        return;
      }
      self->do_write();
    });
  }

  void close() {
    if (closed) return;
    closed = true;
    drop_offered_fd();
    drop_unfinished();
    boost::system::error_code ignored;
    sock.shutdown(stream::socket::shutdown_both, ignored);
    sock.close(ignored);
    d.on_closed(*this);
  }
};

// What a policy sees of stage session `s` (its statistics aside).
StageView view_of(const Session& s) {
  StageView v;
  v.name = s.name;
  v.pid = s.cred.pid;
  v.uid = s.cred.uid;
  v.labels = s.labels;
  v.connected_at_ns = s.connected_at_ns;
  v.info = s.info;
  return v;
}

// ---------------------------------------------------------------------------

Status Daemon::Impl::install_policy(PolicyDoc d, std::string source) {
  auto p = make_policy(d.policy, d.config);
  if (!p) return p.status();
  policy = std::move(*p);
  doc = std::move(d);
  policy_source = std::move(source);
  int want = opt.interval_ms ? *opt.interval_ms : doc.interval_ms.value_or(1000);
  if (want != interval_ms) {
    interval_ms = want;
    if (!stopped && acceptor.is_open()) {
      next_tick = std::chrono::steady_clock::now() + std::chrono::milliseconds(interval_ms);
      schedule_tick();
    }
  }
  spdlog::info("policy '{}' from {} (interval {} ms)", doc.policy, policy_source, interval_ms);
  return Status::ok();
}

Status Daemon::Impl::bind_socket() {
  const std::string& path = opt.socket_path;
  if (path.empty()) return Status::invalid("socket path: required");
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return Status::invalid("socket path: longer than " +
                           std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + " bytes: " + path);
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status::precondition(path + " exists and is not a socket; refusing to replace it");
    }
    // A socket file: is a daemon behind it?
    int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) return Status::io_error(std::string("socket: ") + std::strerror(errno));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    int r = ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    int err = errno;
    ::close(probe);
    if (r == 0) return Status::precondition("a daemon is already serving on " + path);
    if (err != ECONNREFUSED) {
      return Status::io_error("cannot probe " + path + ": " + std::strerror(err));
    }
    spdlog::info("removing stale socket {}", path);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Status::io_error("cannot remove stale socket " + path + ": " + std::strerror(errno));
    }
  }
  gid_t gid = static_cast<gid_t>(-1);
  if (!opt.socket_group.empty()) {
    std::vector<char> buf(16384);
    group g{};
    group* res = nullptr;
    if (::getgrnam_r(opt.socket_group.c_str(), &g, buf.data(), buf.size(), &res) != 0 || !res) {
      return Status::not_found("socket group '" + opt.socket_group + "' does not exist");
    }
    gid = res->gr_gid;
  }
  boost::system::error_code ec;
  acceptor.open(stream(), ec);
  if (ec) return Status::io_error("socket: " + ec.message());
  // The umask makes the socket 0600 from the moment it exists.
  mode_t old = ::umask(0177);
  acceptor.bind(stream::endpoint(path), ec);
  ::umask(old);
  if (ec) return Status::io_error("bind " + path + ": " + ec.message());
  if (gid != static_cast<gid_t>(-1)) {
    if (::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0 || ::chmod(path.c_str(), 0660)) {
      Status s = Status::io_error("cannot give " + path + " to group " + opt.socket_group + ": " +
                                  std::strerror(errno));
      ::unlink(path.c_str());
      return s;
    }
  } else if (::chmod(path.c_str(), 0600) != 0) {
    return Status::io_error("chmod " + path + ": " + std::strerror(errno));
  }
  acceptor.listen(1024, ec);
  if (ec) return Status::io_error("listen " + path + ": " + ec.message());
  if (::lstat(path.c_str(), &st) == 0) socket_ino = st.st_ino;
  return Status::ok();
}

void Daemon::Impl::start_accept() {
  acceptor.async_accept([this](boost::system::error_code ec, stream::socket sock) {
    if (stopped) return;
    if (!ec) {
      accept_backoff = std::chrono::milliseconds(0);
      on_accept(std::move(sock));
    } else if (ec == asio::error::operation_aborted) {
      return;
    } else {
      on_accept_error(ec);
      return;
    }
    start_accept();
  });
}

void Daemon::Impl::on_accept_error(const boost::system::error_code& ec) {
  ++conn_stats.accept_errors;
  const bool no_descriptors = ec == asio::error::no_descriptors || ec.value() == ENFILE;
  if (no_descriptors && evict_one(0)) {  // a descriptor is free again
    peer_log(spdlog::level::warn, "accept", "accept: {}; closed an idle connection for room",
             ec.message());
    start_accept();
    return;
  }
  if (no_descriptors) refuse_with_spare();
  // Back off (10 ms doubling to 1 s, reset by the next connection accepted)
  // rather than spin on an error that persists.
  accept_backoff = std::clamp(accept_backoff * 2, std::chrono::milliseconds(10),
                              std::chrono::milliseconds(1000));
  peer_log(spdlog::level::warn, "accept", "accept: {}; accepting again in {} ms", ec.message(),
           accept_backoff.count());
  accept_timer.expires_after(accept_backoff);
  accept_timer.async_wait([this](boost::system::error_code e) {
    if (!e && !stopped) start_accept();
  });
}

void Daemon::Impl::refuse_with_spare() {
  if (spare.fd < 0) return;
  ::close(spare.fd);
  spare.fd = -1;
  const int fd = ::accept4(acceptor.native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) {
    std::string frame;
    (void)wire::append_frame(
        wire::make_error(0, Status::unavailable("the daemon is out of file descriptors; "
                                                "try again later")),
        frame);
    (void)::send(fd, frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    ::close(fd);
    ++conn_stats.refused_full;
  }
  spare.fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

void Daemon::Impl::on_accept(stream::socket sock) {
  // In the session arena, with its queues: their memory goes back when the
  // connection closes (session_arena.h).
  auto s = std::allocate_shared<Session>(SessionAllocator<Session>(), *this, std::move(sock),
                                         next_sid++);
  socklen_t len = sizeof(s->cred);
  if (::getsockopt(s->sock.native_handle(), SOL_SOCKET, SO_PEERCRED, &s->cred, &len) != 0) {
    peer_log(spdlog::level::warn, "peer_credentials",
             "session {}: SO_PEERCRED failed: {}; refusing", s->sid, std::strerror(errno));
    boost::system::error_code ignored;
    s->sock.close(ignored);
    return;
  }
  if (opt.peer_credentials_hook) {
    DaemonOptions::PeerCredentials c{s->cred.pid, s->cred.uid, s->cred.gid};
    opt.peer_credentials_hook(s->sock.native_handle(), c);
    s->cred.pid = static_cast<pid_t>(c.pid);
    s->cred.uid = c.uid;
    s->cred.gid = c.gid;
  }
  s->accepted_ns = s->last_frame_ns = now_ns();
  sessions.emplace(s->sid, s);
  if (Status allowed = authorize(access, s->cred.uid, Action::kConnect); !allowed.is_ok()) {
    ++conn_stats.refused_uid;
    peer_log(spdlog::level::warn, "refused_uid", "session {}: refusing peer uid {} pid {}", s->sid,
             s->cred.uid, s->cred.pid);
    s->refuse(allowed);
    return;
  }
  if (!make_room(*s)) return;
  silent.insert(s->sid);
  spdlog::debug("session {}: peer pid {} uid {}", s->sid, s->cred.pid, s->cred.uid);
  s->start_read();
}

// ---------------------------------------------------------------------------
// Limits (docs/protocol.md "Limits").

namespace {

std::int64_t ns_of(std::chrono::milliseconds d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

}  // namespace

void Daemon::Impl::setup_limits() {
  access.daemon_uid = ::geteuid();
  access.admin_uids = opt.admin_uids;
  access.allow_uids = opt.allow_uids;
  // Connections come and go with stages: a burst of them says little, and
  // the lines still go at ten a second.
  logs.set_limit("stage_connected", {10.0, 200.0});
  logs.set_limit("stage_disconnected", {10.0, 200.0});
  // The soft descriptor limit raised to the hard one; the connection limit
  // fitted below it.
  rlimit rl{};
  std::size_t descriptors = 1024;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    constexpr rlim_t kMost = rlim_t{1} << 20;
    const rlim_t want = std::min(rl.rlim_max, kMost);
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
      rlimit up = rl;
      up.rlim_cur = want;
      if (::setrlimit(RLIMIT_NOFILE, &up) == 0) rl = up;
    }
    descriptors = rl.rlim_cur == RLIM_INFINITY ? kMost : static_cast<std::size_t>(rl.rlim_cur);
  }
  const std::size_t room = descriptors > kReservedDescriptors + kAdminReserve + 8
                               ? descriptors - kReservedDescriptors - kAdminReserve
                               : 8;
  conn_limit = std::min(opt.max_connections, room);
  if (conn_limit < opt.max_connections) {
    spdlog::info("connection limit lowered from {} to {} by the descriptor limit ({})",
                 opt.max_connections, conn_limit, descriptors);
  }
  buffer_budget = std::max(opt.max_buffered, opt.max_frame + rbuf.size());
  spare.fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

bool Daemon::Impl::make_room(Session& s) {
  while (sessions.size() > conn_limit && evict_one(s.sid)) {
  }
  if (sessions.size() <= conn_limit ||
      (access.is_admin(s.cred.uid) && sessions.size() <= conn_limit + kAdminReserve)) {
    return true;
  }
  ++conn_stats.refused_full;
  peer_log(spdlog::level::warn, "connection_limit",
           "session {}: refusing uid {} pid {}: {} connections open (limit {}), none to close",
           s.sid, s.cred.uid, s.cred.pid, sessions.size() - 1, conn_limit);
  s.refuse(Status::unavailable("the daemon is at its connection limit (" +
                               std::to_string(conn_limit) + "); try again later"));
  return false;
}

bool Daemon::Impl::evict_one(std::uint64_t keep) {
  std::shared_ptr<Session> victim;
  for (std::uint64_t sid : silent) {
    if (sid == keep) continue;
    if (auto it = sessions.find(sid); it != sessions.end()) {
      victim = it->second;
      break;
    }
  }
  if (!victim) {
    for (auto& [sid, x] : sessions) {
      if (sid == keep || x->closed || x->is_stage || x->awaiting > 0 || x->counted_bytes > 0 ||
          !x->outq.empty()) {
        continue;
      }
      if (!victim || x->last_frame_ns < victim->last_frame_ns) victim = x;
    }
  }
  if (!victim) return false;
  ++conn_stats.evicted;
  peer_log(spdlog::level::warn, "evicted",
           "session {} (uid {} pid {}): closed to make room for a newer connection ({} open)",
           victim->sid, victim->cred.uid, victim->cred.pid, sessions.size());
  victim->refuse(Status::unavailable(
      "closed to make room for a newer connection: the daemon is at its connection limit (" +
      std::to_string(conn_limit) + ") and this one was " +
      (victim->said_anything ? "idle" : "silent")));
  return true;
}

void Daemon::Impl::on_frame(Session& s) {
  s.last_frame_ns = now_ns();
  s.frame_started_ns = 0;
  if (!s.said_anything) {
    s.said_anything = true;
    silent.erase(s.sid);
  }
}

bool Daemon::Impl::note_unfinished(Session& s) {
  const std::size_t held = s.decoder.buffered();
  if (held < s.counted_bytes) released_since_trim += s.counted_bytes - held;
  buffered_total = buffered_total - s.counted_bytes + held;
  s.counted_bytes = held;
  if (held == 0) {
    s.frame_started_ns = 0;
  } else if (s.frame_started_ns == 0) {
    s.frame_started_ns = now_ns();
  }
  if (buffered_total <= buffer_budget) return true;
  // Over the budget: the oldest unfinished frames go, clients' first (a
  // frame's bytes arrive in microseconds over a local socket; the oldest
  // are the stalled ones).
  std::vector<std::shared_ptr<Session>> holders;
  for (auto& [sid, x] : sessions) {
    if (x.get() != &s && x->counted_bytes > 0 && !x->closed) holders.push_back(x);
  }
  std::sort(holders.begin(), holders.end(), [](const auto& a, const auto& b) {
    return std::pair(a->is_stage, a->frame_started_ns) <
           std::pair(b->is_stage, b->frame_started_ns);
  });
  holders.push_back(s.shared_from_this());  // last: it alone never exceeds the budget
  for (auto& x : holders) {
    if (buffered_total <= buffer_budget) break;
    ++conn_stats.over_budget;
    peer_log(spdlog::level::warn, "buffer_budget",
             "session {} (uid {} pid {}): closed with {} bytes of an unfinished frame: "
             "unfinished frames hold {} bytes, over the budget of {}",
             x->sid, x->cred.uid, x->cred.pid, x->counted_bytes, buffered_total, buffer_budget);
    x->refuse(Status::unavailable(
        "closed with an unfinished frame: the daemon holds " + std::to_string(buffered_total) +
        " bytes of unfinished frames, over its budget of " + std::to_string(buffer_budget)));
  }
  return !s.closed;
}

void Daemon::Impl::schedule_sweep() {
  std::chrono::milliseconds shortest = std::min(opt.handshake_timeout, opt.frame_timeout);
  if (opt.idle_timeout.count() > 0) shortest = std::min(shortest, opt.idle_timeout);
  const auto period =
      std::clamp(shortest / 4, std::chrono::milliseconds(5), std::chrono::milliseconds(1000));
  sweep_timer.expires_after(period);
  sweep_timer.async_wait([this](boost::system::error_code ec) {
    if (ec || stopped) return;
    sweep();
    schedule_sweep();
  });
}

void Daemon::Impl::sweep() {
  const std::int64_t now = now_ns();
  const std::int64_t handshake = ns_of(opt.handshake_timeout);
  const std::int64_t frame = ns_of(opt.frame_timeout);
  const std::int64_t idle = ns_of(opt.idle_timeout);
  std::vector<std::pair<std::shared_ptr<Session>, std::string>> expired;
  for (auto& [sid, s] : sessions) {
    if (s->closed || s->close_after_write) continue;
    if (!s->said_anything && now - s->accepted_ns > handshake) {
      expired.emplace_back(s, "no complete request within " +
                                  std::to_string(opt.handshake_timeout.count()) +
                                  " ms of connecting");
    } else if (s->frame_started_ns != 0 && now - s->frame_started_ns > frame) {
      expired.emplace_back(s, "a frame unfinished after " +
                                  std::to_string(opt.frame_timeout.count()) + " ms (" +
                                  std::to_string(s->decoder.buffered()) + " bytes received)");
    } else if (!s->is_stage && idle > 0 && s->awaiting == 0 && s->outq.empty() &&
               now - s->last_frame_ns > idle) {
      expired.emplace_back(s, "no request for " + std::to_string(opt.idle_timeout.count()) + " ms");
    }
  }
  for (auto& [s, why] : expired) {
    ++conn_stats.timed_out;
    peer_log(spdlog::level::info, "timeout", "session {} (uid {} pid {}): {}; closing", s->sid,
             s->cred.uid, s->cred.pid, why);
    s->refuse(Status::unavailable(why + "; closing the connection"));
  }
  for (const auto& [kind, n] : logs.take_summaries(now)) {
    spdlog::warn("{} more '{}' messages suppressed", n, kind);
  }
  // Memory freed by many closed connections or large frames goes back to the
  // system rather than staying at its peak.
  if (closed_since_trim >= 64 || released_since_trim >= (8u << 20)) {
    ::malloc_trim(0);
    closed_since_trim = 0;
    released_since_trim = 0;
  }
}

json Daemon::Impl::connection_metrics() const {
  return json{{"open", sessions.size()},
              {"limit", conn_limit},
              {"admin_reserve", kAdminReserve},
              {"unfinished_frame_bytes", buffered_total},
              {"unfinished_frame_budget", buffer_budget},
              {"evicted", conn_stats.evicted},
              {"refused_full", conn_stats.refused_full},
              {"refused_uid", conn_stats.refused_uid},
              {"denied", conn_stats.denied},
              {"timed_out", conn_stats.timed_out},
              {"over_budget", conn_stats.over_budget},
              {"accept_errors", conn_stats.accept_errors}};
}

void Daemon::Impl::on_closed(Session& s) {
  std::shared_ptr<Session> keep;  // s stays alive until we are done with it
  if (auto it = sessions.find(s.sid); it != sessions.end()) {
    keep = it->second;
    sessions.erase(it);
  }
  silent.erase(s.sid);
  ++closed_since_trim;
  if (s.is_stage) {
    auto it = stages.find(s.name);
    if (it != stages.end() && it->second.get() == &s) stages.erase(it);
    departed.push_back(s.name);
    peer_log(spdlog::level::info, "stage_disconnected", "stage '{}' disconnected", s.name);
  }
  bool was_outstanding = s.collect_id != 0;
  s.collect_id = 0;
  if (!s.step_rules.empty()) {
    spdlog::debug("stage '{}' disconnected before applying {} rules batch(es)", s.name,
                  s.step_rules.size());
    s.step_rules.clear();
  }
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
  if (was_outstanding && round_open && --outstanding <= 0) {
    asio::post(io, [this, r = round] {
      if (round_open && round == r && outstanding <= 0) finish_round();
    });
  }
}

void Daemon::Impl::schedule_tick() {
  tick_timer.expires_at(next_tick);
  tick_timer.async_wait([this](boost::system::error_code ec) {
    if (ec || stopped) return;
    tick();
  });
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

void Daemon::Impl::tick() {
  auto interval = std::chrono::milliseconds(interval_ms);
  next_tick += interval;
  auto now_tp = std::chrono::steady_clock::now();
  if (next_tick <= now_tp) next_tick = now_tp + interval;
  schedule_tick();
  retired_in = PolicyInput{};
  retired_out = PolicyOutput{};
  if (round_open) finish_round();

  const std::int64_t now = now_ns();
  std::vector<std::shared_ptr<Session>> list;
  list.reserve(stages.size());
  for (auto& [name, s] : stages) list.push_back(s);
  const std::int64_t timeout_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(opt.forward_timeout).count();
  for (auto& s : list) {
    // Requests past their deadline. The rules stay on the stage's connection
    // (nothing can take them back), so they are pending, not failed: the
    // requester is told so, and the stage's late answer is still taken.
    std::size_t overdue = 0;
    // Answered after the walk: answering may close a session, the stage's
    // own included (a stage may forward rules to itself), which clears
    // s->forwards.
    std::vector<std::pair<std::function<void(const wire::Message*, const Status&)>, Status>> due;
    for (auto& [id, f] : s->forwards) {
      if (f.overdue) {
        ++overdue;
        continue;
      }
      if (f.deadline_ns > now) continue;
      f.overdue = true;
      ++overdue;
      if (!f.done) continue;
      const std::string waited = std::to_string(opt.forward_timeout.count()) + " ms";
      due.emplace_back(
          std::move(f.done),
          Status::pending(
              s->written_bytes >= f.frame_end
                  ? "stage '" + s->name + "' has not answered in " + waited +
                        " (stopped or busy?): the rules reached it and it applies them when it "
                        "resumes reading, unless it exits first; its rules_version in `sluice "
                        "stages` moves when it has"
                  : "stage '" + s->name + "' has not answered in " + waited +
                        " nor read the rules (stopped or busy?): they are queued for it and "
                        "applied when it resumes reading, unless it disconnects first"));
      f.done = nullptr;
    }
    for (auto it = s->forwards.begin(); overdue > kMaxOverdue && it != s->forwards.end();) {
      if (!it->second.overdue) {
        ++it;
        continue;
      }
      it = s->forwards.erase(it);  // its late answer will be ignored
      --overdue;
    }
    for (auto& [done, status] : due) done(nullptr, status);
    if (s->closed) continue;
    for (StepRules& r : s->step_rules) {
      if (r.overdue || r.decided_ns + timeout_ns > now) continue;
      r.overdue = true;
      spdlog::info(
          "stage '{}' has not answered the policy's rules in {} ms: they apply when it "
          "resumes reading",
          s->name, opt.forward_timeout.count());
    }
    while (s->step_rules.size() > kMaxOverdue && s->step_rules.front().overdue) {
      s->step_rules.pop_front();
    }
    if (s->collect_id != 0) {
      // Given up on for this round, but its answer is still taken when it
      // comes: it may carry the stage's new description, sent only once.
      s->late_collects.push_back(s->collect_id);
      if (s->late_collects.size() > kMaxOverdue) s->late_collects.pop_front();
      s->collect_id = 0;
      if (++s->missed >= opt.max_missed) {
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
  // Sending may close a session (queue overflow), which edits `stages`.
  list.clear();
  for (auto& [name, s] : stages) list.push_back(s);
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
    if (ec || stopped) return;
    if (round_open && round == r) finish_round();
  });
}

void Daemon::Impl::on_collect_answer(Session& s, wire::Message& msg) {
  s.collect_id = 0;
  s.missed = 0;
  s.late_collects.clear();  // answers come in order: the earlier ones came or never will
  take_collect_answer(s, msg);
  // collect_id is the current round's: a new round forgets unanswered ones.
  if (round_open && --outstanding <= 0) finish_round();
}

bool Daemon::Impl::on_late_collect_answer(Session& s, wire::Message& msg) {
  auto it = std::find(s.late_collects.begin(), s.late_collects.end(), msg.id);
  if (it == s.late_collects.end()) return false;
  s.late_collects.erase(s.late_collects.begin(), it + 1);
  ++late_collect_answers;
  take_collect_answer(s, msg);
  return true;
}

void Daemon::Impl::take_collect_answer(Session& s, wire::Message& msg) {
  if (msg.type == wire::Type::kStats) {
    // The parts kept are moved out of the answer, not copied: with 100
    // stages at 10 Hz, copying them and then freeing three trees per answer
    // took a fifth of the daemon's time (perf).
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
      auto inf = stage_info_from_json(*it);
      if (inf) {
        s.info = std::move(*inf);
        s.info_json = std::move(*it);
        s.has_info = true;
      }
    }
  }
}

bool Daemon::Impl::on_step_rules_answer(Session& s, std::uint64_t id, const wire::Message* msg) {
  auto it = s.step_rules.begin();
  while (it != s.step_rules.end() && it->id != id) ++it;  // the first, but for a stray answer
  if (it == s.step_rules.end()) return false;
  const std::int64_t decided = it->decided_ns;
  if (it->overdue) {
    ++late_rules_answers;
    spdlog::info("stage '{}' answered the policy's rules {} ms after they were sent", s.name,
                 (now_ns() - decided) / 1'000'000);
  }
  s.step_rules.erase(it);
  if (decided == step_decided_ns && step_unanswered > 0 && --step_unanswered == 0) {
    push_sample(rules_cpu_us, static_cast<double>(thread_cpu_ns() - step_cpu0_ns) / 1e3);
  }
  if (msg == nullptr || msg->type == wire::Type::kAck) {
    push_sample(propagation_us, static_cast<double>(now_ns() - decided) / 1e3);
  } else {
    peer_log(spdlog::level::warn, "rules_rejected", "stage '{}' rejected the policy's rules: {}",
             s.name, wire::error_status(msg->body).message());
  }
  return true;
}

void Daemon::Impl::finish_round() {
  round_open = false;
  round_timer.cancel();
  ++rounds_done;
  push_sample(round_us, static_cast<double>(now_ns() - round_start_ns) / 1e3);
  run_step();
}

void Daemon::Impl::run_step() {
  if (!policy) return;
  PolicyInput in;
  in.now_ns = now_ns();
  in.interval_ns = std::int64_t{interval_ms} * 1'000'000;
  in.started_ns = started_ns;
  std::map<std::int64_t, ProcIo> io_by_pid;
  for (auto& [name, s] : stages) {
    if (s->collect_id != 0) continue;  // late: its stats are not in yet
    StageView v = view_of(*s);
    v.stats = std::move(s->stats);
    s->stats = StageStats{};
    auto it = io_by_pid.find(v.pid);
    if (it == io_by_pid.end()) it = io_by_pid.emplace(v.pid, read_proc_io(v.pid)).first;
    ProcIo pio = it->second;
    if (pio.valid && s->io_prev.valid) {
      auto delta = [](std::uint64_t a, std::uint64_t b) { return a >= b ? a - b : 0; };
      pio.delta_read_bytes = delta(pio.read_bytes, s->io_prev.read_bytes);
      pio.delta_write_bytes = delta(pio.write_bytes, s->io_prev.write_bytes);
      pio.delta_rchar = delta(pio.rchar, s->io_prev.rchar);
      pio.delta_wchar = delta(pio.wchar, s->io_prev.wchar);
    }
    if (pio.valid) s->io_prev = pio;
    s->io_last = pio;
    v.io = pio;
    in.stages.push_back(std::move(v));
  }
  in.departed = std::move(departed);
  departed.clear();
  PolicyOutput out;
  try {
    out = policy->step(in);
  } catch (const std::exception& e) {
    spdlog::error("policy '{}' step failed: {}", policy->name(), e.what());
    return;
  }
  last_report = std::move(out.report);
  const std::int64_t decided = now_ns();
  step_cpu0_ns = thread_cpu_ns();
  step_decided_ns = decided;
  step_unanswered = 0;
  // Tunables go to the boards first: the change is in effect in those stages
  // before the first frame leaves (the frames then wake them to answer).
  write_boards(out, decided);
  // A policy often sends the same batch to many stages (static does). Each
  // distinct batch is serialised once and its bytes shared by the frames of
  // every stage that gets it: the N-th stage's rules then leave after N small
  // frame heads rather than after N serialisations. Batches are told apart by
  // identity (RulesBatch): comparing them, cold as they are by then, cost
  // about a microsecond per stage.
  std::unordered_map<const void*, std::shared_ptr<const std::string>> serialised;
  step_write_ns = 0;
  std::size_t sent = 0;
  rusage ru0{};
  ::getrusage(RUSAGE_THREAD, &ru0);
  // The policy's batches and the stages are both maps by name: walked
  // together rather than every name looked up.
  auto st = stages.begin();
  for (const auto& [name, batch] : out.rules) {
    while (st != stages.end() && st->first < name) ++st;
    if (st == stages.end()) break;
    if (st->first != name) continue;
    // Held: sending may close the session, which erases it from `stages`
    // (the iterator has moved past it by then).
    std::shared_ptr<Session> stage = st->second;
    ++st;
    auto [text, added] = serialised.try_emplace(batch.identity());
    if (added) text->second = std::make_shared<const std::string>(wire::dump(batch.value()));
    ++sent;
    send_step_rules(*stage, text->second, decided);
  }
  if (sent > 0) {
    const std::int64_t total = now_ns() - decided;
    push_sample(send_total_us, static_cast<double>(total) / 1e3);
    push_sample(send_write_us, static_cast<double>(step_write_ns) / 1e3);
    push_sample(send_build_us, static_cast<double>(total - step_write_ns) / 1e3);
    rusage ru1{};
    ::getrusage(RUSAGE_THREAD, &ru1);
    push_sample(send_preempted, static_cast<double>(ru1.ru_nivcsw - ru0.ru_nivcsw));
  }
  // Hand the CPU to the stages just woken. A write to a Unix socket wakes its
  // reader with the kernel's "the writer is about to sleep" hint, so Linux
  // often queues the woken stage threads on this CPU, behind the daemon,
  // rather than on an idle one. The daemon does not sleep, though: it goes on
  // to read the acks, and the queued stages waited until it ran out of work
  // (on two vCPUs, a scheduler trace showed one of the two stage threads of
  // sluice-bench-control starting its 50 stages 600-800 us after its first
  // frame was written, with the other vCPU idle). Yielding once, after the
  // last frame, lets them apply their rules first; the acks wait. Where the
  // stages run elsewhere it is a syscall that returns at once.
  if (sent > 0) ::sched_yield();
  if (report_log) {  // after the rules left: the log never delays them
    const double unix_time =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    const std::string line =
        json{{"unix_time", unix_time}, {"policy", doc.policy}, {"report", last_report}}.dump() +
        "\n";
    if (std::fputs(line.c_str(), report_log.get()) < 0 || std::fflush(report_log.get()) != 0) {
      spdlog::error("report log {}: {}; no longer writing it", opt.report_log,
                    std::strerror(errno));
      report_log.reset();
    }
  }
  retired_in = std::move(in);  // freed at the next tick (see retired_in)
  retired_out = std::move(out);
}

namespace {

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

void Daemon::Impl::write_boards(const PolicyOutput& out, std::int64_t decided_ns) {
  std::unordered_map<const void*, std::optional<BoardPlan>> plans;  // by batch identity
  std::vector<BoardWrite> scratch;
  std::size_t written = 0;
  auto st = stages.begin();
  for (const auto& [name, batch] : out.rules) {
    while (st != stages.end() && st->first < name) ++st;
    if (st == stages.end()) break;
    if (st->first != name) continue;
    Session& stage = *st->second;
    ++st;
    if (!stage.board.mapped() || !stage.has_info) continue;
    auto [plan, added] = plans.try_emplace(batch.identity());
    if (added) plan->second = board_plan(batch.value());
    if (!plan->second || !write_board(stage, *plan->second, scratch)) continue;
    const std::int64_t t = now_ns();
    ++written;
    push_sample(board_propagation_us, static_cast<double>(t - decided_ns) / 1e3);
    if (opt.on_board_written) opt.on_board_written(stage.name, decided_ns, t);
  }
  if (written > 0) {
    board_writes += written;
    push_sample(board_us, static_cast<double>(now_ns() - decided_ns) / 1e3);
  }
}

void Daemon::Impl::send_step_rules(Session& stage,
                                   const std::shared_ptr<const std::string>& batch_json,
                                   std::int64_t decided_ns, bool in_step) {
  const std::uint64_t id = stage.next_id++;
  char head[wire::kRulesFrameHeadMax];
  const std::size_t n =
      wire::write_rules_frame_head(id, decided_ns, batch_json->size(), head, opt.max_frame);
  if (n == 0) {  // the stage would refuse the frame and close
    spdlog::warn(
        "rules for stage '{}' not sent: a batch of {} bytes exceeds the frame size "
        "limit ({} bytes)",
        stage.name, batch_json->size(), opt.max_frame);
    return;
  }
  stage.step_rules.push_back({id, decided_ns});
  if (!in_step) {
    stage.send_parts(std::string_view(head, n), batch_json, "}");
    return;
  }
  ++step_unanswered;
  const std::int64_t t0 = now_ns();
  stage.send_parts(std::string_view(head, n), batch_json, "}");
  const std::int64_t t1 = now_ns();
  step_write_ns += t1 - t0;
  if (opt.on_rules_written) opt.on_rules_written(stage.name, decided_ns, t1);
}

void Daemon::Impl::send_first_rules(const std::shared_ptr<Session>& s) {
  RulesBatch batch;
  const std::int64_t now = now_ns();
  if (policy) {
    PolicyInput in;
    in.now_ns = now;
    in.interval_ns = std::int64_t{interval_ms} * 1'000'000;
    in.started_ns = started_ns;
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
      const std::int64_t t = now_ns();
      ++board_writes;
      push_sample(board_propagation_us, static_cast<double>(t - now) / 1e3);
      if (opt.on_board_written) opt.on_board_written(s->name, now, t);
    }
  }
  const json& rules =
      batch.value().is_null() ? json{{"version", 1}, {"rules", json::array()}} : batch.value();
  send_step_rules(*s, std::make_shared<const std::string>(wire::dump(rules)), now,
                  /*in_step=*/false);
}

void Daemon::Impl::handle(const std::shared_ptr<Session>& s, const std::string& payload) {
  std::uint64_t id = 0;
  auto m = wire::parse_message(payload, &id);
  if (!m) {
    peer_log(spdlog::level::debug, "invalid_message", "session {}: invalid message: {}", s->sid,
             m.status().message());
    s->send(wire::make_error(id, m.status()));
    return;
  }
  switch (m->type) {
    case wire::Type::kAck:
    case wire::Type::kError:
    case wire::Type::kStats: {
      if (s->collect_id != 0 && m->id == s->collect_id) {
        on_collect_answer(*s, *m);
        return;
      }
      if (!s->late_collects.empty() && on_late_collect_answer(*s, *m)) return;
      if (on_step_rules_answer(*s, m->id, &*m)) return;
      if (auto it = s->forwards.find(m->id); it != s->forwards.end()) {
        Forward f = std::move(it->second);
        s->forwards.erase(it);
        if (!f.overdue) {
          if (f.done) f.done(&*m, Status::ok());
          return;
        }
        // The requester was told "pending": this is how it ended.
        ++late_rules_answers;
        const std::int64_t ms = (now_ns() - f.sent_ns) / 1'000'000;
        if (m->type == wire::Type::kAck) {
          spdlog::info(
              "stage '{}' applied rules from uid {} {} ms after they were sent "
              "(rules_version {})",
              s->name, f.uid, ms, m->body.value("rules_version", std::uint64_t{0}));
        } else {
          spdlog::warn("stage '{}' refused rules from uid {} {} ms after they were sent: {}",
                       s->name, f.uid, ms, wire::error_status(m->body).message());
        }
        return;
      }
      peer_log(spdlog::level::debug, "unexpected_answer", "session {}: unexpected {} for id {}",
               s->sid, wire::type_name(m->type), m->id);
      return;  // a reply is never answered
    }
    case wire::Type::kHello:
      handle_hello(s, *m);
      return;
    case wire::Type::kRules:
    case wire::Type::kCollect:
      s->send(wire::make_error(
          m->id, Status::invalid("'" + std::string(wire::type_name(m->type)) +
                                 "' is sent by the daemon to stages, not to the daemon")));
      return;
    default:
      handle_client(s, *m);
      return;
  }
}

void Daemon::Impl::handle_hello(const std::shared_ptr<Session>& s, const wire::Message& m) {
  if (s->is_stage) {
    s->send(wire::make_error(
        m.id, Status::precondition("hello: already registered as stage '" + s->name + "'")));
    return;
  }
  const json& b = m.body;
  std::string base = b.at("name").get<std::string>();
  if (!valid_stage_name(base)) {
    s->send(wire::make_error(
        m.id, Status::invalid("hello: field 'name': " + std::string(kStageNameRule))));
    return;
  }
  std::string name = base;
  for (int n = 2; stages.count(name); ++n) name = base + "-" + std::to_string(n);
  s->is_stage = true;
  s->name = name;
  s->claimed_pid = b.at("pid").get<std::int64_t>();
  if (auto it = b.find("labels"); it != b.end()) {
    for (auto& [k, v] : it->items()) s->labels[k] = v.get<std::string>();
  }
  s->connected_at_ns = now_ns();
  if (auto it = b.find("info"); it != b.end()) {
    auto inf = stage_info_from_json(*it);
    if (inf) {
      s->info = std::move(*inf);
      s->info_json = *it;
      s->has_info = true;
    }
  }
  if (auto it = b.find("board"); it != b.end()) map_board(*s, *it);
  stages[name] = s;
  peer_log(spdlog::level::info, "stage_connected", "stage '{}' connected (pid {}, uid {}{})", name,
           s->cred.pid, s->cred.uid, s->board.mapped() ? ", board" : "");
  s->send(wire::make_ack(
      m.id, json{{"name", name}, {"interval_ms", interval_ms}, {"board", s->board.mapped()}}));
  // Then, before anything else, its first rules: the stage holds its first
  // enforced request until they are in (docs/protocol.md).
  send_first_rules(s);
}

// The board a stage offered in its hello (`offer`, validated by
// wire::parse_message), with the descriptor that came with the hello. A
// board that is not one (no descriptor, another layout or size, not a
// sealed memfd) is refused with a warning; the stage is served by messages.
void Daemon::Impl::map_board(Session& s, const json& offer) {
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
    peer_log(spdlog::level::warn, "board_refused",
             "stage '{}': board refused: {}; sending it messages only", s.name, why);
  }
}

json Daemon::Impl::stage_summary(const Session& s, std::int64_t now) const {
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

json Daemon::Impl::metrics() const {
  return json{{"rounds", rounds_done},
              {"stages", stages.size()},
              {"sessions", sessions.size()},
              {"dropped_missed", dropped_missed},
              {"late_collect_answers", late_collect_answers},
              {"late_rules_answers", late_rules_answers},
              {"collect_round_us", summary(round_us)},
              {"propagation_us", summary(propagation_us)},
              {"board_writes", board_writes},
              {"board_us", summary(board_us)},
              {"board_propagation_us", summary(board_propagation_us)},
              {"rules_build_us", summary(send_build_us)},
              {"rules_write_us", summary(send_write_us)},
              {"rules_send_us", summary(send_total_us)},
              {"rules_send_preemptions", summary(send_preempted)},
              {"rules_cpu_us", summary(rules_cpu_us)},
              {"connections", connection_metrics()},
              {"log_lines", logs.counts()}};
}

void Daemon::Impl::deny(Session& s, std::uint64_t id, const Status& why) {
  ++conn_stats.denied;
  peer_log(spdlog::level::warn, "denied", "session {} (pid {}): {}", s.sid, s.cred.pid,
           why.message());
  s.send(wire::make_error(id, why));
}

void Daemon::Impl::handle_client(const std::shared_ptr<Session>& s, const wire::Message& m) {
  const std::int64_t now = now_ns();
  const json& b = m.body;
  switch (m.type) {
    case wire::Type::kListStages: {
      json list = json::array();
      for (auto& [name, st] : stages) list.push_back(stage_summary(*st, now));
      s->send(wire::make_ack(m.id, json{{"stages", std::move(list)}}));
      return;
    }
    case wire::Type::kGetStats: {
      std::string only = b.value("stage", std::string());
      if (!only.empty() && !stages.count(only)) {
        s->send(wire::make_error(m.id, Status::not_found("no stage named '" + only + "'")));
        return;
      }
      json list = json::array();
      for (auto& [name, st] : stages) {
        if (!only.empty() && name != only) continue;
        json e = stage_summary(*st, now);
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
      s->send(wire::make_message(wire::Type::kStats, m.id,
                                 json{{"interval_ms", interval_ms}, {"stages", std::move(list)}}),
              kMaxClientReply);
      return;
    }
    case wire::Type::kApplyRules: {
      std::string target = b.at("stage").get<std::string>();
      auto it = stages.find(target);
      if (it == stages.end()) {
        s->send(wire::make_error(m.id, Status::not_found("no stage named '" + target + "'")));
        return;
      }
      if (Status allowed =
              authorize(access, s->cred.uid, Action::kApplyRules, target, it->second->cred.uid);
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
          opt.max_frame);
      if (!made.is_ok()) {  // the stage would refuse the frame and close
        reply(nullptr, made.with_prefix("rules for stage '" + target + "': "));
        return;
      }
      Forward f;
      f.deadline_ns =
          now + std::chrono::duration_cast<std::chrono::nanoseconds>(opt.forward_timeout).count();
      f.sent_ns = now;
      f.frame_end = stage->queued_bytes + frame.size();
      f.uid = s->cred.uid;
      f.done = std::move(reply);
      stage->forwards.emplace(fid, std::move(f));
      stage->send_frame(std::move(frame));
      return;
    }
    case wire::Type::kPolicyShow: {
      json d = policy ? policy->describe() : json();
      s->send(wire::make_ack(m.id, json{{"policy", doc.policy},
                                        {"interval_ms", interval_ms},
                                        {"source", policy_source},
                                        {"config", doc.config},
                                        {"describe", std::move(d)},
                                        {"report", last_report},
                                        {"policies", policy_names()},
                                        {"metrics", metrics()}}));
      return;
    }
    case wire::Type::kPolicySet: {
      if (Status allowed = authorize(access, s->cred.uid, Action::kSetPolicy); !allowed.is_ok()) {
        deny(*s, m.id, allowed);
        return;
      }
      auto d = parse_policy_doc(b.at("policy"), /*from_wire=*/true);
      if (!d) {
        s->send(wire::make_error(m.id, d.status().with_prefix("policy_set: ")));
        return;
      }
      std::string name = d->policy;
      Status st = install_policy(std::move(*d), "socket (uid " + std::to_string(s->cred.uid) + ")");
      if (!st.is_ok()) {
        s->send(wire::make_error(m.id, st.with_prefix("policy_set: ")));
        return;
      }
      s->send(wire::make_ack(m.id, json{{"policy", name}, {"interval_ms", interval_ms}}));
      return;
    }
    default:
      s->send(wire::make_error(m.id, Status::invalid("'" + std::string(wire::type_name(m.type)) +
                                                     "' is not a request the daemon serves")));
      return;
  }
}

void Daemon::Impl::wait_signal() {
  signals.async_wait([this](boost::system::error_code ec, int sig) {
    if (ec || stopped) return;
    if (sig == SIGHUP) {
      if (opt.policy_file.empty()) {
        spdlog::info("SIGHUP: no policy file to reload");
      } else {
        auto d = load_policy_file(opt.policy_file);
        Status st = d ? install_policy(std::move(*d), opt.policy_file) : d.status();
        if (!st.is_ok())
          spdlog::error("reload failed; keeping the current policy: {}", st.message());
      }
      wait_signal();
    } else {
      spdlog::info("signal {}: shutting down", sig);
      shutdown();
    }
  });
}

void Daemon::Impl::shutdown() {
  if (stopped) return;
  stopped = true;
  boost::system::error_code ignored;
  acceptor.close(ignored);
  tick_timer.cancel();
  round_timer.cancel();
  sweep_timer.cancel();
  accept_timer.cancel();
  signals.cancel(ignored);
  auto all = sessions;
  for (auto& [id, s] : all) s->close();
  io.stop();
}

// ---------------------------------------------------------------------------

StatusOr<std::unique_ptr<Daemon>> Daemon::create(DaemonOptions options) {
  if (options.max_missed < 1) return Status::invalid("max_missed: must be >= 1");
  if (options.interval_ms && (*options.interval_ms < 1 || *options.interval_ms > 3600000)) {
    return Status::invalid("interval: must be 1..3600000 ms");
  }
  if (options.max_frame < 1024) return Status::invalid("max_frame: must be >= 1024 bytes");
  if (options.max_connections < 1) return Status::invalid("max_connections: must be >= 1");
  if (options.handshake_timeout.count() < 1 || options.frame_timeout.count() < 1 ||
      options.idle_timeout.count() < 0) {
    return Status::invalid(
        "timeouts: the handshake and frame timeouts must be >= 1 ms, the idle timeout >= 0");
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  PolicyDoc doc;
  std::string source = "default";
  if (!impl->opt.policy_file.empty()) {
    auto d = load_policy_file(impl->opt.policy_file);
    if (!d) return d.status();
    doc = std::move(*d);
    source = impl->opt.policy_file;
  } else if (!impl->opt.policy_doc.is_null()) {
    auto d = parse_policy_doc(impl->opt.policy_doc, false);
    if (!d) return d.status();
    doc = std::move(*d);
    source = "options";
  }
  SLUICE_RETURN_IF_ERROR(impl->install_policy(std::move(doc), source));
  if (!impl->opt.report_log.empty()) {
    impl->report_log.reset(std::fopen(impl->opt.report_log.c_str(), "ae"));
    if (!impl->report_log) {
      return Status::io_error("report log " + impl->opt.report_log + ": " + std::strerror(errno));
    }
  }
  impl->setup_limits();
  SLUICE_RETURN_IF_ERROR(impl->bind_socket());
  return std::unique_ptr<Daemon>(new Daemon(std::move(impl)));
}

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Daemon::~Daemon() {
  if (!impl_) return;
  struct stat st {};
  if (impl_->socket_ino && ::lstat(impl_->opt.socket_path.c_str(), &st) == 0 &&
      st.st_ino == impl_->socket_ino) {
    ::unlink(impl_->opt.socket_path.c_str());
  }
}

Status Daemon::run() {
  Impl& d = *impl_;
  if (d.opt.handle_signals) {
    boost::system::error_code ec;
    d.signals.add(SIGHUP, ec);
    d.signals.add(SIGINT, ec);
    d.signals.add(SIGTERM, ec);
    d.wait_signal();
  }
  d.started_ns = now_ns();
  d.start_accept();
  d.schedule_sweep();
  d.next_tick = std::chrono::steady_clock::now() + std::chrono::milliseconds(d.interval_ms);
  d.schedule_tick();
  spdlog::info("serving on {}", d.opt.socket_path);
  try {
    d.io.run();
  } catch (const std::exception& e) {
    return Status::internal(std::string("event loop: ") + e.what());
  }
  struct stat st {};
  if (d.socket_ino && ::lstat(d.opt.socket_path.c_str(), &st) == 0 && st.st_ino == d.socket_ino) {
    ::unlink(d.opt.socket_path.c_str());
    d.socket_ino = 0;
  }
  return Status::ok();
}

void Daemon::stop() {
  asio::post(impl_->io, [d = impl_.get()] { d->shutdown(); });
}

void Daemon::request_reload() {
  asio::post(impl_->io, [d = impl_.get()] {
    if (d->opt.policy_file.empty()) return;
    auto doc = load_policy_file(d->opt.policy_file);
    Status st = doc ? d->install_policy(std::move(*doc), d->opt.policy_file) : doc.status();
    if (!st.is_ok()) spdlog::error("reload failed; keeping the current policy: {}", st.message());
  });
}

}  // namespace sluice::control
