// The control-plane wire protocol: framing and message validation.
#include "sluice/wire.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <limits>
#include <utility>

#include "code_names.h"
#include "sluice/board.h"
#include "sluice/json_text.h"
#include "sluice/stage.h"  // kMaxStageNameLength

namespace sluice::wire {
namespace {

using nlohmann::json;

constexpr std::array<std::string_view, kTypeCount> kTypeNames = {
    "hello",       "rules",     "collect",     "stats",       "ack",        "error",
    "list_stages", "get_stats", "apply_rules", "policy_show", "policy_set",
};

// Nesting deeper than kMaxJsonDepth is refused at parse time: it has no use
// in the protocol and recursive consumers (dump, rule validation) must stay
// bounded.
struct TooDeep {};

std::string json_kind(const json& v) {
  return v.type_name();
}

// The member `field` of `body` when it has one of the kind `is` accepts
// (`expected` names it in the error): *out points to it, or is null when it
// is absent and not `required`.
Status want(const json& body, const char* field, bool required, bool (*is)(const json&),
            const char* expected, const json** out = nullptr) {
  auto it = body.find(field);
  if (out) *out = nullptr;
  if (it == body.end()) {
    if (required) return Status::invalid(std::string("missing field '") + field + "'");
    return Status::ok();
  }
  if (!is(*it)) {
    return Status::invalid(std::string("field '") + field + "': expected " + expected + ", got " +
                           json_kind(*it));
  }
  if (out) *out = &*it;
  return Status::ok();
}

Status want_string(const json& body, const char* field, bool required, std::size_t max_len = 256) {
  const json* v = nullptr;
  SLUICE_RETURN_IF_ERROR(want(
      body, field, required, [](const json& j) { return j.is_string(); }, "a string", &v));
  if (v == nullptr) return Status::ok();
  const auto& s = v->get_ref<const std::string&>();
  if (required && s.empty()) {
    return Status::invalid(std::string("field '") + field + "': must not be empty");
  }
  if (s.size() > max_len) {
    return Status::invalid(std::string("field '") + field + "': longer than " +
                           std::to_string(max_len) + " characters");
  }
  return Status::ok();
}

Status want_integer(const json& body, const char* field, bool required) {
  return want(
      body, field, required, [](const json& j) { return j.is_number_integer(); }, "an integer");
}

Status want_object(const json& body, const char* field, bool required) {
  return want(
      body, field, required, [](const json& j) { return j.is_object(); }, "an object");
}

Status want_batch(const json& body, const char* field) {
  return want(
      body, field, true, [](const json& j) { return j.is_array() || j.is_object(); },
      R"(a rules batch (an array or {"version": 1, "rules": [...]}))");
}

Status check_fields(Type t, const json& body) {
  switch (t) {
    case Type::kHello: {
      SLUICE_RETURN_IF_ERROR(want_string(body, "name", true, kMaxStageNameLength));
      SLUICE_RETURN_IF_ERROR(want_integer(body, "pid", true));
      SLUICE_RETURN_IF_ERROR(want_integer(body, "protocol", true));
      SLUICE_RETURN_IF_ERROR(want_integer(body, "uid", false));
      SLUICE_RETURN_IF_ERROR(want_object(body, "labels", false));
      SLUICE_RETURN_IF_ERROR(want_object(body, "info", false));
      SLUICE_RETURN_IF_ERROR(want_object(body, "board", false));
      if (auto it = body.find("board"); it != body.end()) {
        SLUICE_RETURN_IF_ERROR(want_integer(*it, "layout", true).with_prefix("board: "));
        SLUICE_RETURN_IF_ERROR(want_integer(*it, "bytes", true).with_prefix("board: "));
      }
      if (auto it = body.find("labels"); it != body.end()) {
        if (it->size() > 64) return Status::invalid("field 'labels': more than 64 labels");
        for (auto& [k, v] : it->items()) {
          if (!v.is_string()) {
            return Status::invalid("field 'labels." + k + "': expected a string, got " +
                                   json_kind(v));
          }
        }
      }
      const auto& proto = body.at("protocol");
      if (proto.get<std::int64_t>() != kProtocolVersion) {
        return Status::invalid("field 'protocol': unsupported protocol version " + proto.dump() +
                               " (this side speaks " + std::to_string(kProtocolVersion) + ")");
      }
      return Status::ok();
    }
    case Type::kRules:
      return want_batch(body, "rules");
    case Type::kCollect:
    case Type::kStats:
    case Type::kAck:
    case Type::kListStages:
    case Type::kPolicyShow:
      return Status::ok();
    case Type::kError:
      SLUICE_RETURN_IF_ERROR(want_string(body, "message", true, std::numeric_limits<int>::max()));
      return want_string(body, "code", false);
    case Type::kGetStats:
      return want_string(body, "stage", false);
    case Type::kApplyRules:
      SLUICE_RETURN_IF_ERROR(want_string(body, "stage", true));
      return want_batch(body, "rules");
    case Type::kPolicySet:
      return want_object(body, "policy", true);
  }
  return Status::internal("unhandled message type");
}

}  // namespace

std::string_view type_name(Type t) noexcept {
  auto i = static_cast<std::size_t>(t);
  return i < kTypeNames.size() ? kTypeNames[i] : std::string_view("?");
}

std::optional<Type> parse_type(std::string_view name) noexcept {
  for (std::size_t i = 0; i < kTypeNames.size(); ++i) {
    if (kTypeNames[i] == name) return static_cast<Type>(i);
  }
  return std::nullopt;
}

namespace {

// A payload of `size` bytes fits a frame of at most `max_frame` (and 32 bits).
Status check_frame_size(std::size_t size, std::size_t max_frame) {
  if (size > max_frame || size > 0xffffffffu) {
    return Status::invalid("frame of " + std::to_string(size) + " bytes exceeds the limit of " +
                           std::to_string(max_frame) + " bytes");
  }
  return Status::ok();
}

// Writes a frame's header, the payload length big-endian, at `at` (kHeaderSize bytes).
void put_frame_length(char* at, std::size_t size) {
  const auto n = static_cast<std::uint32_t>(size);
  at[0] = static_cast<char>((n >> 24) & 0xff);
  at[1] = static_cast<char>((n >> 16) & 0xff);
  at[2] = static_cast<char>((n >> 8) & 0xff);
  at[3] = static_cast<char>(n & 0xff);
}

}  // namespace

Status append_raw_frame(std::string_view payload, std::string& out, std::size_t max_frame) {
  SLUICE_RETURN_IF_ERROR(check_frame_size(payload.size(), max_frame));
  out.append(kHeaderSize, '\0');
  put_frame_length(out.data() + out.size() - kHeaderSize, payload.size());
  out.append(payload);
  return Status::ok();
}

Status append_frame(const json& msg, std::string& out, std::size_t max_frame) {
  return append_raw_frame(dump(msg), out, max_frame);
}

std::string encode_frame(const json& msg) {
  std::string out;
  (void)append_frame(msg, out, std::numeric_limits<std::uint32_t>::max());
  return out;
}

std::string dump(const json& j) {
  // `replace` keeps dump() from throwing on strings that are not valid UTF-8.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Status make_shared_frame(const json& msg, std::string_view key,
                         std::shared_ptr<const std::string> raw_value, SharedFrame& out,
                         std::size_t max_frame) {
  if (!msg.is_object()) return Status::invalid("a message must be a JSON object");
  if (!raw_value) return Status::invalid("make_shared_frame: no value");
  if (msg.contains(key)) {
    return Status::invalid("make_shared_frame: the message already has '" + std::string(key) + "'");
  }
  // {"a":1} + "k", V -> {"a":1,"k":V}: the message without its closing brace,
  // the key, the shared value, then the brace.
  std::string body = dump(msg);
  body.pop_back();
  if (!msg.empty()) body += ',';
  body += dump(json(std::string(key)));
  body += ':';
  const std::size_t payload = body.size() + raw_value->size() + 1;
  SLUICE_RETURN_IF_ERROR(check_frame_size(payload, max_frame));
  out.head.assign(kHeaderSize, '\0');
  put_frame_length(out.head.data(), payload);
  out.head += body;
  out.shared = std::move(raw_value);
  out.tail = "}";
  return Status::ok();
}

namespace {

// The rules frame's head without its length (kHeaderSize bytes left for it):
// make_message's keys in the order dump() writes them (sorted), then the
// batch's key, as make_shared_frame splices it. Returns the head's length.
// The longest: 4 + 14 + 20 (INT64_MIN) + 6 + 20 (UINT64_MAX) + 30 = 94 bytes.
std::size_t rules_head(std::uint64_t id, std::int64_t decided_ns, char* out) {
  static_assert(kRulesFrameHeadMax >= 94);
  constexpr std::string_view kOpen = R"({"decided_ns":)";
  constexpr std::string_view kId = R"(,"id":)";
  constexpr std::string_view kRest = R"(,"type":"rules","v":1,"rules":)";
  char* p = out + kHeaderSize;
  p = std::copy(kOpen.begin(), kOpen.end(), p);
  p = std::to_chars(p, p + 20, decided_ns).ptr;
  p = std::copy(kId.begin(), kId.end(), p);
  p = std::to_chars(p, p + 20, id).ptr;
  p = std::copy(kRest.begin(), kRest.end(), p);
  return static_cast<std::size_t>(p - out);
}

}  // namespace

std::size_t write_rules_frame_head(std::uint64_t id, std::int64_t decided_ns,
                                   std::size_t batch_size, char* out, std::size_t max_frame) {
  const std::size_t head = rules_head(id, decided_ns, out);
  const std::size_t payload = head - kHeaderSize + batch_size + 1;
  if (!check_frame_size(payload, max_frame).is_ok()) return 0;
  put_frame_length(out, payload);
  return head;
}

Status make_rules_frame(std::uint64_t id, std::int64_t decided_ns,
                        std::shared_ptr<const std::string> batch_json, SharedFrame& out,
                        std::size_t max_frame) {
  if (!batch_json) return Status::invalid("make_rules_frame: no batch");
  char head[kRulesFrameHeadMax];
  const std::size_t n = rules_head(id, decided_ns, head);
  const std::size_t payload = n - kHeaderSize + batch_json->size() + 1;
  SLUICE_RETURN_IF_ERROR(check_frame_size(payload, max_frame));
  put_frame_length(head, payload);
  out.head.assign(head, n);
  out.shared = std::move(batch_json);
  out.tail = "}";
  return Status::ok();
}

void append_rules_ack_frame(std::uint64_t id, std::uint64_t rules_version, std::string& out) {
  char num[24];
  const std::size_t start = out.size();
  out.append(kHeaderSize, '\0');  // the length, once known
  out += R"({"id":)";
  out.append(num, std::to_chars(num, num + sizeof(num), id).ptr);
  out += R"(,"rules_version":)";
  out.append(num, std::to_chars(num, num + sizeof(num), rules_version).ptr);
  out += R"(,"type":"ack","v":1})";
  put_frame_length(out.data() + start, out.size() - start - kHeaderSize);
}

void FrameDecoder::feed(const char* data, std::size_t n) {
  if (failed_ || n == 0) return;
  // Reclaim consumed bytes before growing.
  if (pos_ > 0 && (pos_ == buf_.size() || pos_ >= buf_.size() / 2)) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  buf_.append(data, n);
}

FrameDecoder::Result FrameDecoder::next(std::string* payload, Status* error) {
  if (failed_) {
    if (error) *error = Status::invalid("the stream is unusable after an oversized frame");
    return Result::kError;
  }
  const std::size_t avail = buf_.size() - pos_;
  if (avail < kHeaderSize) return Result::kNeedMore;
  const auto* p = reinterpret_cast<const unsigned char*>(buf_.data() + pos_);
  const std::uint32_t n = (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) |
                          (std::uint32_t{p[2]} << 8) | std::uint32_t{p[3]};
  if (n > max_frame_) {
    failed_ = true;
    buf_.clear();
    buf_.shrink_to_fit();
    pos_ = 0;
    if (error) {
      *error = Status::invalid("frame of " + std::to_string(n) + " bytes exceeds the limit of " +
                               std::to_string(max_frame_) + " bytes");
    }
    return Result::kError;
  }
  if (avail - kHeaderSize < n) return Result::kNeedMore;
  payload->assign(buf_, pos_ + kHeaderSize, n);
  pos_ += kHeaderSize + n;
  if (pos_ == buf_.size()) {
    if (buf_.capacity() > kKeptCapacity) {
      std::string().swap(buf_);  // a large frame's buffer goes back with it
    } else {
      buf_.clear();
    }
    pos_ = 0;
  }
  return Result::kFrame;
}

StatusOr<Message> parse_message(std::string_view payload, std::uint64_t* id_out) {
  if (id_out) *id_out = 0;
  if (payload.empty()) return Status::invalid("malformed JSON: empty frame");
  json j;
  try {
    // The depth is checked on the text, before parsing, rather than by a
    // parser callback called for every value: every message is parsed here.
    if (!json_depth_within(payload)) throw TooDeep{};
    j = json::parse(payload.begin(), payload.end());
  } catch (const json::parse_error& e) {
    // e.byte is 1-based: the byte at which parsing failed.
    std::string what = e.what();
    if (auto c = what.find("syntax error"); c != std::string::npos) what = what.substr(c);
    // nlohmann quotes the token it last read, which a peer makes as long as it likes.
    return Status::invalid("malformed JSON at byte " + std::to_string(e.byte) + ": " +
                           bound_text(what, 2 * kMaxEcho));
  } catch (const TooDeep&) {
    return Status::invalid("malformed JSON: nested deeper than " + std::to_string(kMaxJsonDepth) +
                           " levels");
  } catch (const std::exception& e) {
    return Status::invalid(std::string("malformed JSON: ") + e.what());
  }
  return message_from_json(std::move(j), id_out);
}

StatusOr<Message> message_from_json(json j, std::uint64_t* id_out) {
  if (id_out) *id_out = 0;
  if (!j.is_object()) {
    return Status::invalid("a message must be a JSON object, got " + json_kind(j));
  }
  Message m;
  if (auto it = j.find("id"); it != j.end()) {
    if (it->is_number_unsigned()) {
      m.id = it->get<std::uint64_t>();
    } else if (it->is_number_integer() && it->get<std::int64_t>() >= 0) {
      m.id = static_cast<std::uint64_t>(it->get<std::int64_t>());
    } else {
      return Status::invalid("field 'id': expected an integer >= 0, got " + echo(*it));
    }
    if (id_out) *id_out = m.id;
  } else {
    return Status::invalid("missing field 'id'");
  }
  auto v = j.find("v");
  if (v == j.end()) return Status::invalid("missing field 'v' (protocol version)");
  if (!v->is_number_integer() || v->get<std::int64_t>() != kProtocolVersion) {
    return Status::invalid("unsupported protocol version " + echo(*v) + " (this side speaks " +
                           std::to_string(kProtocolVersion) + ")");
  }
  auto t = j.find("type");
  if (t == j.end()) return Status::invalid("missing field 'type'");
  if (!t->is_string()) return Status::invalid("field 'type': expected a string");
  auto type = parse_type(t->get_ref<const std::string&>());
  if (!type) {
    std::string name = t->get<std::string>();
    if (name.size() > 64) name = name.substr(0, 64) + "...";
    return Status::invalid("unknown message type '" + name + "'");
  }
  m.type = *type;
  Status s = check_fields(m.type, j);
  if (!s.is_ok()) return s.with_prefix(std::string(type_name(m.type)) + ": ");
  m.body = std::move(j);
  return m;
}

std::optional<RulesMessage> read_rules(const Message& m) {
  if (m.type != Type::kRules) return std::nullopt;
  auto rules = m.body.find("rules");
  if (rules == m.body.end()) return std::nullopt;  // not from parse_message
  RulesMessage r;
  r.id = m.id;
  r.rules = &*rules;
  if (auto d = m.body.find("decided_ns"); d != m.body.end() && d->is_number_integer()) {
    // An unsigned value above int64's range is not a time on this clock.
    if (!d->is_number_unsigned() ||
        d->get<std::uint64_t>() <=
            static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      r.decided_ns = d->get<std::int64_t>();
    }
  }
  return r;
}

std::optional<RulesAck> read_rules_ack(const Message& m) {
  if (m.type != Type::kAck) return std::nullopt;
  auto v = m.body.find("rules_version");
  if (v == m.body.end() || !v->is_number_integer()) return std::nullopt;
  if (!v->is_number_unsigned() && v->get<std::int64_t>() < 0) return std::nullopt;
  return RulesAck{m.id, v->get<std::uint64_t>()};
}

json make_message(Type t, std::uint64_t id, json fields) {
  json m = json::object();
  m["v"] = kProtocolVersion;
  m["type"] = std::string(type_name(t));
  m["id"] = id;
  if (fields.is_object()) {
    for (auto& [k, v] : fields.items()) m[k] = std::move(v);
  }
  return m;
}

json make_ack(std::uint64_t id, json fields) {
  return make_message(Type::kAck, id, std::move(fields));
}

json board_offer() {
  return json{{"layout", kBoardLayoutVersion}, {"bytes", kBoardBytes}};
}

json make_error(std::uint64_t id, const Status& status) {
  return make_message(Type::kError, id,
                      json{{"code", std::string(error_code_name(status.code()))},
                           {"message", bound_text(status.message(), kMaxErrorMessage)}});
}

std::string_view error_code_name(Code c) noexcept {
  const sluice::detail::CodeName* n = sluice::detail::names_of(c);
  return n != nullptr ? n->wire : "internal";
}

Code parse_code(std::string_view name) noexcept {
  for (const sluice::detail::CodeName& n : sluice::detail::kCodeNames) {
    if (n.wire == name || n.text == name) return n.code;
  }
  return Code::kInternal;
}

std::string bound_text(std::string_view text, std::size_t max) {
  if (text.size() <= max) return std::string(text);
  std::size_t cut = max;
  // Back to the start of a UTF-8 character (continuation bytes are 10xxxxxx).
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) --cut;
  std::string out(text.substr(0, cut));
  out += "... (";
  out += std::to_string(text.size());
  out += " bytes)";
  return out;
}

std::string echo(const json& v, std::size_t max) {
  return bound_text(dump(v), max);
}

Status error_status(const json& msg) {
  if (!msg.is_object()) return Status::internal("malformed error message");
  std::string message = "unknown error";
  Code code = Code::kInternal;
  if (auto it = msg.find("message"); it != msg.end() && it->is_string()) {
    message = bound_text(it->get_ref<const std::string&>(), kMaxErrorMessage);
  }
  if (auto it = msg.find("code"); it != msg.end() && it->is_string()) {
    code = parse_code(it->get_ref<const std::string&>());
  }
  if (code == Code::kOk) code = Code::kInternal;
  return Status(code, std::move(message));
}

}  // namespace sluice::wire
