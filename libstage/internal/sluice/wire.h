// The control-plane wire protocol (docs/protocol.md), shared by the daemon,
// the stage's ControlClient and the CLI. A frame is a 4-byte big-endian
// length and one JSON object; a frame over the limit is refused and the
// connection closed. Every message carries {"v": 1, "type", "id"}; an answer
// repeats its request's id, and id 0 means "no request". Nothing here does
// I/O: FrameDecoder consumes bytes however split, encode_frame produces them,
// parse_message validates one payload.
//
// Thread safety: free functions are safe from any thread; a FrameDecoder is a
// value used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "sluice/status.h"

namespace sluice::wire {

inline constexpr int kProtocolVersion = 1;
inline constexpr std::size_t kHeaderSize = 4;
inline constexpr std::size_t kDefaultMaxFrame = 4u << 20;  // 4 MiB

enum class Type : std::uint8_t {
  // stage <-> daemon
  kHello = 0,  // stage -> daemon: who I am; answered by ack {name}
  kRules,      // daemon -> stage: a rules batch; ack {rules_version} | error
  kCollect,    // daemon -> stage: answered by stats {stats, info}
  kStats,      // reply to collect and get_stats
  kAck,        // success reply
  kError,      // failure reply {code, message}
  // client (CLI) -> daemon
  kListStages,  // ack {stages: [...]}
  kGetStats,    // {stage?} -> stats {stages: [...]}
  kApplyRules,  // {stage, rules} -> ack {rules_version} | error
  kPolicyShow,  // ack {policy, interval_ms, config, describe, report}
  kPolicySet,   // {policy: <policy file object>} -> ack | error
};
inline constexpr int kTypeCount = 11;

std::string_view type_name(Type t) noexcept;
std::optional<Type> parse_type(std::string_view name) noexcept;
// True for ack, error and stats: messages that answer a request.
inline bool is_reply(Type t) noexcept {
  return t == Type::kAck || t == Type::kError || t == Type::kStats;
}

// ---------------------------------------------------------------------------
// Frames.

// Appends one frame (header + payload) to `out`. Fails when the payload is
// larger than `max_frame`.
Status append_raw_frame(std::string_view payload, std::string& out,
                        std::size_t max_frame = kDefaultMaxFrame);
// Serialises `msg` compactly and frames it.
Status append_frame(const nlohmann::json& msg, std::string& out,
                    std::size_t max_frame = kDefaultMaxFrame);
std::string encode_frame(const nlohmann::json& msg);  // no limit check

// `j` serialised as append_frame does (compact; invalid UTF-8 replaced).
std::string dump(const nlohmann::json& j);

// A frame whose payload embeds bytes shared with other frames: the same rules
// batch sent to many stages is serialised once, and each stage's frame is its
// own small head and tail around that one buffer. The frame's bytes, in order,
// are head, *shared (when set), tail.
struct SharedFrame {
  std::string head;
  std::shared_ptr<const std::string> shared;
  std::string tail;
  std::size_t size() const noexcept {
    return head.size() + (shared ? shared->size() : 0) + tail.size();
  }
};
// Frames the object `msg` with one more member, `key`, whose value is
// `raw_value`: JSON text as dump() produces it (not checked here). `msg` must
// be an object without `key`. Fails when the payload exceeds `max_frame`.
Status make_shared_frame(const nlohmann::json& msg, std::string_view key,
                         std::shared_ptr<const std::string> raw_value, SharedFrame& out,
                         std::size_t max_frame = kDefaultMaxFrame);

// The frame of a `rules` message with a batch already serialised by dump():
// the bytes make_shared_frame(make_message(kRules, id, {"decided_ns": D}),
// "rules", batch_json) produces, written directly rather than through a JSON
// value (the daemon builds one per stage per step). Fails when the payload
// exceeds `max_frame`.
Status make_rules_frame(std::uint64_t id, std::int64_t decided_ns,
                        std::shared_ptr<const std::string> batch_json, SharedFrame& out,
                        std::size_t max_frame = kDefaultMaxFrame);

// The head of make_rules_frame's frame (the length, then the message up to
// and including `"rules":`), written into `out`, which has room for
// kRulesFrameHeadMax bytes: its length, or 0 when a batch of `batch_size`
// bytes would make the payload exceed `max_frame`. The frame is this head,
// the batch, then "}". For a sender that writes the three parts straight to
// a socket (the daemon, to every stage each step) without building a frame.
inline constexpr std::size_t kRulesFrameHeadMax = 96;
std::size_t write_rules_frame_head(std::uint64_t id, std::int64_t decided_ns,
                                   std::size_t batch_size, char* out,
                                   std::size_t max_frame = kDefaultMaxFrame);

// Appends the frame of a stage's answer to a rules message,
// {"id": id, "rules_version": v, "type": "ack", "v": 1}: the bytes
// append_frame(make_ack(id, {"rules_version": v})) produces, written directly
// (every stage sends one per rules message, on the propagation path).
void append_rules_ack_frame(std::uint64_t id, std::uint64_t rules_version, std::string& out);

// Incremental frame decoder: feed() bytes as they arrive, in pieces of any
// size, then call next() until it returns kNeedMore. After kError (an
// oversized frame) the decoder stays failed: the stream cannot be resynced.
// Memory: it holds only bytes fed and not yet returned (a frame announced
// by its header reserves nothing); once it holds none, a buffer that grew
// past kKeptCapacity is freed, so an idle decoder costs no more than that.
class FrameDecoder {
 public:
  enum class Result { kNeedMore, kFrame, kError };

  explicit FrameDecoder(std::size_t max_frame = kDefaultMaxFrame) : max_frame_(max_frame) {}

  void feed(const char* data, std::size_t n);
  void feed(std::string_view bytes) { feed(bytes.data(), bytes.size()); }
  // kFrame: *payload holds the next payload. kError: *error says why.
  Result next(std::string* payload, Status* error);

  bool failed() const noexcept { return failed_; }
  // Bytes received but not yet returned as frames (a partial frame).
  std::size_t buffered() const noexcept { return buf_.size() - pos_; }
  // True when a frame has started (some bytes are buffered): a peer closing
  // now closed mid-frame.
  bool mid_frame() const noexcept { return buffered() > 0; }
  std::size_t max_frame() const noexcept { return max_frame_; }
  // Bytes of memory the decoder's buffer holds (for tests and accounting).
  std::size_t capacity() const noexcept { return buf_.capacity(); }
  static constexpr std::size_t kKeptCapacity = 16 * 1024;

 private:
  std::size_t max_frame_;
  std::string buf_;
  std::size_t pos_ = 0;
  bool failed_ = false;
};

// ---------------------------------------------------------------------------
// Messages.

struct Message {
  Type type = Type::kError;
  std::uint64_t id = 0;
  nlohmann::json body;  // the whole object, including v/type/id
};

// Parses and validates one payload: JSON syntax (the error gives the byte
// position), an object, "v" == kProtocolVersion, a known "type", an integer
// "id" >= 0, and the fields that type requires (see docs/protocol.md). On
// failure, *id_out (when given) receives the id if it could be read, so the
// error reply can name the request; it is 0 otherwise.
StatusOr<Message> parse_message(std::string_view payload, std::uint64_t* id_out = nullptr);
// The same checks on an already-parsed JSON value.
StatusOr<Message> message_from_json(nlohmann::json j, std::uint64_t* id_out = nullptr);

// The fields of a rules message, read from what parse_message gave. `rules`
// points into the message's body (valid while the message lives), and is an
// array or an object, as parse_message checked. `decided_ns` is
// informational: 0 when absent or not an integer within int64.
struct RulesMessage {
  std::uint64_t id = 0;
  std::int64_t decided_ns = 0;
  const nlohmann::json* rules = nullptr;
};
// std::nullopt when `m` is not a rules message.
std::optional<RulesMessage> read_rules(const Message& m);

// A stage's answer to a rules message, as append_rules_ack_frame writes it:
// an ack with the stage's rules version.
struct RulesAck {
  std::uint64_t id = 0;
  std::uint64_t rules_version = 0;
};
// std::nullopt when `m` is not an ack whose "rules_version" is an integer
// >= 0 (the ack of a hello, say).
std::optional<RulesAck> read_rules_ack(const Message& m);

// Builds {"v": 1, "type": <t>, "id": id} plus the members of `fields` (an
// object, or null for none).
nlohmann::json make_message(Type t, std::uint64_t id,
                            nlohmann::json fields = nlohmann::json::object());
nlohmann::json make_ack(std::uint64_t id, nlohmann::json fields = nlohmann::json::object());
// {"type": "error", "code": <error_code_name>, "message": ...}; a message
// longer than kMaxErrorMessage is cut (bound_text).
nlohmann::json make_error(std::uint64_t id, const Status& status);

// What a stage's hello says of the board whose descriptor travels with it
// (sluice/board.h): {"layout": kBoardLayoutVersion, "bytes": kBoardBytes}.
nlohmann::json board_offer();
// The Status an error message describes (kInternal when it cannot be read;
// its message cut to kMaxErrorMessage bytes).
Status error_status(const nlohmann::json& msg);
// A code's name on the wire, snake_case: "invalid_argument", "not_found",
// "already_exists", "failed_precondition", "unavailable", "cancelled",
// "io_error", "internal", "permission_denied" ("ok" for kOk).
std::string_view error_code_name(Code c) noexcept;
// Maps error_code_name() back to a Code; also takes the spaced names
// (sluice::code_name) that peers of earlier versions sent. kInternal for
// anything else.
Code parse_code(std::string_view name) noexcept;

// Bounds on what an error echoes. A value quoted in a message (a match, a
// field a peer sent) is at most kMaxEcho bytes of its JSON text; a whole
// error message on the wire is at most kMaxErrorMessage bytes.
inline constexpr std::size_t kMaxEcho = 256;
inline constexpr std::size_t kMaxErrorMessage = 4096;
// `text` when it has at most `max` bytes; else its first bytes (cut at a
// UTF-8 character boundary), "...", and the whole length:
// `[1,2,3,... (3888890 bytes)`. The result is at most max + 32 bytes.
std::string bound_text(std::string_view text, std::size_t max);
// `v` as JSON text for an error message, bounded by bound_text.
std::string echo(const nlohmann::json& v, std::size_t max = kMaxEcho);

}  // namespace sluice::wire
