// The daemon's inside (daemon.h): its parts, what each owns, and its file.
//   Daemon::Impl    lifecycle: options, the event loop, signals (daemon.cc)
//   Session         one connection: socket I/O, framing, the descriptor a
//                   hello brings, the stage it is after hello (transport.cc)
//   Connections     the listening socket, every session, who may connect,
//                   connection limits (transport.cc, limits.cc)
//   Stages          stages by name: hellos, boards, messages (stages.cc)
//   CollectRounds   the collect round every interval (stages.cc)
//   PolicyStep      the policy in force and its step (step.cc)
//   Requests        clients' requests, rules forwarded for them (requests.cc)
// Every part lives on the daemon's one loop thread; parts reach each other
// through the Impl they belong to.
#pragma once

// GCC 12 reports false positives inside Asio's and nlohmann's headers after
// inlining; they are not in our code. Under -fsanitize=thread GCC also flags
// Asio's atomic_thread_fence (-Wtsan).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wnull-dereference"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wtsan"
#endif

#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>
#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "access.h"
#include "daemon.h"
#include "daemon_observer.h"
#include "log_limiter.h"
#include "policy_doc.h"
#include "session_arena.h"
#include "sluice/board.h"
#include "sluice/policy.h"
#include "sluice/stage.h"
#include "sluice/wire.h"

namespace sluice::control {

namespace asio = boost::asio;
using stream = asio::local::stream_protocol;

// Steady clock, ns.
std::int64_t now_ns();
inline std::int64_t ns_of(std::chrono::milliseconds d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

// Upper bound on bytes queued for one peer; a peer that does not read is
// disconnected rather than allowed to grow the daemon without bound.
inline constexpr std::size_t kMaxQueuedBytes = 64u << 20;
// Requests a stage has left unanswered past their deadline whose late answers
// the daemon still takes (per stage and kind; the oldest are forgotten first).
inline constexpr std::size_t kMaxOverdue = 256;

// A running count, mean and maximum of durations (us): what `policy show`
// reports of a latency, in constant time and space.
struct Tally {
  std::uint64_t count = 0;
  double sum_us = 0;
  double max_us = 0;
  void add_ns(std::int64_t ns) {
    const double us = static_cast<double>(ns) / 1e3;
    ++count;
    sum_us += us;
    if (us > max_us) max_us = us;
  }
  nlohmann::json to_json() const {
    return {{"count", count},
            {"mean", count > 0 ? sum_us / static_cast<double>(count) : 0.0},
            {"max", max_us}};
  }
};

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

// One connection: a stage's or a client's (transport.cc).
struct Session : std::enable_shared_from_this<Session> {
  Session(Daemon::Impl& daemon, stream::socket s, std::uint64_t id);
  ~Session();

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
  std::uint64_t rules_refused = 0;  // the policy's rules batches it refused
  StageInfo info;
  nlohmann::json info_json = nlohmann::json::object();
  bool has_info = false;           // info and info_json hold a description the stage sent
  nlohmann::json last_stats_json;  // the latest collect's stats, for get_stats
  StageStats stats;                // not yet handed to the policy
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
  // The board the stage handed over with its hello (mapped by Stages::hello),
  // and, until the connection's first frame was handled, the descriptor that
  // came with its first bytes (-1: none).
  BoardWriter board;
  int offered_fd = -1;
  bool first_read = true;

  // Limits: when it connected and completed its last frame, when the frame
  // being read began (0: none), what of it counts in buffered_total.
  std::int64_t accepted_ns = 0;
  std::int64_t last_frame_ns = 0;
  std::int64_t frame_started_ns = 0;
  std::size_t counted_bytes = 0;
  bool said_anything = false;  // has completed a frame
  int awaiting = 0;            // its apply_rules requests not answered yet

  void drop_offered_fd();
  // Waits for the socket to be readable, then reads it (read_now). The
  // socket holds the bytes until then: a session has no buffer of its own
  // but its decoder's, which holds only unfinished frames.
  void start_read();
  void read_now();
  // One recvmsg into the daemon's read buffer; the first may bring a board.
  ssize_t receive();
  void on_read(boost::system::error_code ec, std::size_t n);
  // Sends `why` (an error, id 0) if the socket takes it at once, then
  // closes: a peer refused or dropped learns why, and one that does not read
  // cannot keep its connection (and its descriptor) open.
  void refuse(const Status& why);
  // Forgets the unfinished frame (its bytes leave the budget and the memory
  // goes back).
  void drop_unfinished();
  // `limit`: the largest frame to send. Stages decode with the default limit;
  // replies to clients (get_stats with many stages) may be larger.
  void send(const nlohmann::json& msg, std::size_t limit = 0);
  // Sends a frame (possibly sharing its bytes with other sessions' frames).
  void send_frame(wire::SharedFrame frame);
  // Sends the frame whose bytes are head, *shared (when set), tail: written
  // at once when nothing is queued, else queued (send_parts in transport.cc).
  void send_parts(std::string_view head, const std::shared_ptr<const std::string>& shared,
                  std::string_view tail, wire::SharedFrame* owner = nullptr);
  // Writes what the socket takes without blocking; 0 on EAGAIN or an error
  // (left to the asynchronous write to report).
  std::size_t write_now(std::string_view head, const std::string* shared, std::string_view tail);
  void do_write();
  void close();
};

// The listening socket, every session, who may connect, and the limits on
// connections (docs/protocol.md "Limits"). Binding, accepting and peer
// credentials are in transport.cc; limits, timeouts and eviction in limits.cc.
struct Connections {
  explicit Connections(Daemon::Impl& daemon);

  Daemon::Impl& d;
  stream::acceptor acceptor;
  ino_t socket_ino = 0;
  std::map<std::uint64_t, std::shared_ptr<Session>> sessions;
  std::uint64_t next_sid = 1;
  AccessRules access;
  std::size_t limit = 0;           // max_connections, fitted to the descriptor limit
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
  asio::steady_timer accept_timer;
  asio::steady_timer sweep_timer;
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
  } counts;

  // transport.cc
  Status bind_socket();
  // Removes the socket file when it is still the one bind_socket made.
  void unlink_socket();
  void start_accept();
  void on_accept(stream::socket sock);
  void on_accept_error(const boost::system::error_code& ec);
  // Out of descriptors: accepts one connection on the spare descriptor to
  // tell it so, and closes it.
  void refuse_with_spare();

  // limits.cc
  // Who may connect, the connection limit fitted to the descriptor limit.
  void setup();
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
  // A session closed: it leaves the table.
  void on_closed(Session& s);
  void schedule_sweep();
  // Timeouts, the log's summaries of suppressed lines, memory returned.
  void sweep();
  nlohmann::json metrics() const;
};

// Stages by their unique name: hellos, boards, and where each message a
// session sends goes (stages.cc).
struct Stages {
  explicit Stages(Daemon::Impl& daemon) : d(daemon) {}

  Daemon::Impl& d;
  std::map<std::string, std::shared_ptr<Session>> by_name;
  std::vector<std::string> departed;  // since the last step

  // One frame's payload from `s`: answers to what the daemon asked, a hello,
  // or a client's request.
  void handle(const std::shared_ptr<Session>& s, const std::string& payload);
  void hello(const std::shared_ptr<Session>& s, const wire::Message& m);
  // The board a stage offered in its hello, with the descriptor that came with it.
  void map_board(Session& s, const nlohmann::json& offer);
  // A stage session closed: it leaves the table (and is departed for the policy).
  void on_closed(Session& s);
  // What `sluice stages` lists of a stage.
  nlohmann::json summary(const Session& s, std::int64_t now) const;
};

// The collect round: every interval, `collect` to every stage, then the
// policy step when all answered or the round's time ran out (stages.cc).
struct CollectRounds {
  explicit CollectRounds(Daemon::Impl& daemon);

  Daemon::Impl& d;
  asio::steady_timer tick_timer;
  asio::steady_timer round_timer;
  std::chrono::steady_clock::time_point next_tick;
  std::uint64_t round = 0;
  bool round_open = false;
  int outstanding = 0;
  std::int64_t round_start_ns = 0;
  std::uint64_t rounds_done = 0;
  std::uint64_t dropped_missed = 0;
  // Answers to collects that came after the daemon stopped waiting for them,
  // taken all the same (their stats and descriptions).
  std::uint64_t late_answers = 0;
  Tally round_time;

  // The first tick one interval from now (and again when the interval changes).
  void start();
  void schedule_tick();
  void tick();
  void finish_round();
  // A stage's answer to its outstanding collect.
  void on_answer(Session& s, wire::Message& msg);
  // A stage's answer to a collect the daemon gave up on (a new round began
  // first); false when `msg` answers none.
  bool on_late_answer(Session& s, wire::Message& msg);
  // Takes the stats and the description a collect's answer carries.
  void take_answer(Session& s, wire::Message& msg);
  // A stage session closed: the round no longer waits for it.
  void on_closed(Session& s);
};

// The policy in force and its step: measure (what the stages answered, their
// /proc/PID/io), decide (Policy::step), the boards, the rules messages, the
// report (step.cc).
struct PolicyStep {
  explicit PolicyStep(Daemon::Impl& daemon) : d(daemon), report_log(nullptr, &std::fclose) {}

  Daemon::Impl& d;
  std::unique_ptr<Policy> policy;
  PolicyDoc doc;
  std::string source;
  int interval_ms = kDefaultIntervalMs;
  nlohmann::json last_report = nlohmann::json::object();
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> report_log;
  // Answers to the policy's rules: acks (decision to ack), those that came
  // after the daemon stopped waiting (taken all the same), boards written
  // (decision to the board written).
  Tally propagation;
  std::uint64_t late_answers = 0;
  std::uint64_t board_writes = 0;
  Tally board_propagation;
  // The step whose answers are counted, and how many it still waits for.
  std::int64_t decided_ns = 0;
  std::size_t unanswered = 0;
  // The last step's policy input and output (every stage's view and rules),
  // freed at the next tick rather than when the step returns, when the stages
  // just sent rules need the CPU to apply them.
  PolicyInput retired_in;
  PolicyOutput retired_out;

  Status install(PolicyDoc doc, std::string source);
  // Frees the last step's input and output (see retired_in).
  void free_last();
  void run();
  // A new stage's first rules frame, right after its hello's answer: what
  // the policy gives it now (Policy::admit), else an empty batch.
  void send_first_rules(const std::shared_ptr<Session>& s);
  // A stage's answer to one of the policy's rules batches; false when `msg`
  // answers none outstanding.
  bool on_answer(Session& s, const wire::Message& msg);
  // Rules batches `s` left unanswered past forward_timeout are logged once.
  void expire(Session& s, std::int64_t now);
  void on_closed(Session& s);

 private:
  // What the policy sees of every stage that answered this round.
  PolicyInput measure(std::int64_t now);
  // Writes the step's tunables to the boards of the stages that have one
  // (before any frame leaves).
  void write_boards(const PolicyOutput& out, std::int64_t decided_ns);
  // Sends every stage its batch, each distinct batch serialised once.
  std::size_t send_rules(const PolicyOutput& out, std::int64_t decided_ns);
  // Sends a rules batch, already serialised (wire::dump), to a stage, and
  // counts it among the step's unanswered (not `in_step`: a new stage's
  // first rules). Sending may close the session (removing it from the
  // stages): the caller holds a reference.
  void send_rules_to(Session& stage, const std::shared_ptr<const std::string>& batch_json,
                     std::int64_t decided_ns, bool in_step);
  // Counts a board written with tunables decided at `decided_ns`.
  void board_written(const Session& stage, std::int64_t decided_ns);
  void write_report();
};

// Clients' requests (list_stages, get_stats, apply_rules, policy_show,
// policy_set), and the rules forwarded to stages for them (requests.cc).
struct Requests {
  explicit Requests(Daemon::Impl& daemon) : d(daemon) {}

  Daemon::Impl& d;
  // Answers to forwarded rules that came after the requester was told
  // `pending`.
  std::uint64_t late_answers = 0;

  void handle(const std::shared_ptr<Session>& s, const wire::Message& m);
  // Answers request `id` with `why` (authorize()'s refusal).
  void deny(Session& s, std::uint64_t id, const Status& why);
  // A stage's answer to a forwarded batch; false when `msg` answers none.
  bool on_forward_answer(Session& s, const wire::Message& msg);
  // Forwards `s` left unanswered past their deadline: their requesters are
  // told they are pending.
  void expire(Session& s, std::int64_t now);
  // A stage session closed: its forwards' requesters learn what became of them.
  void on_closed(Session& s);
  // What `policy show` reports of the daemon itself.
  nlohmann::json metrics() const;

 private:
  void apply_rules(const std::shared_ptr<Session>& s, const wire::Message& m);
};

struct Daemon::Impl {
  explicit Impl(DaemonOptions o);

  DaemonOptions opt;
  DaemonObserver* const observer;  // opt.observer
  asio::io_context io;
  asio::signal_set signals;
  bool stopped = false;
  std::int64_t started_ns = 0;  // run() began serving (PolicyInput::started_ns)
  LogLimiter logs;

  Connections conns;
  Stages stages;
  CollectRounds rounds;
  PolicyStep step;
  Requests requests;

  // A session closed: every part forgets it.
  void on_closed(Session& s);
  // Re-reads the policy file (SIGHUP, request_reload).
  void reload();
  void wait_signal();
  void shutdown();

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

}  // namespace sluice::control
