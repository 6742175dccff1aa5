// The frame codec and message validation (libstage/internal/sluice/wire.h).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "sluice/board.h"
#include "sluice/wire.h"

using nlohmann::json;
using sluice::Code;
using sluice::Status;
using sluice::wire::FrameDecoder;
namespace wire = sluice::wire;

namespace {

std::vector<std::string> drain(FrameDecoder& d) {
  std::vector<std::string> out;
  std::string p;
  Status err;
  while (d.next(&p, &err) == FrameDecoder::Result::kFrame) out.push_back(p);
  return out;
}

std::string header(std::uint32_t n) {
  std::string h(4, '\0');
  h[0] = static_cast<char>(n >> 24);
  h[1] = static_cast<char>(n >> 16);
  h[2] = static_cast<char>(n >> 8);
  h[3] = static_cast<char>(n);
  return h;
}

}  // namespace

TEST_CASE("frames carry a big-endian length and the JSON payload", "[wire]") {
  json m = wire::make_message(wire::Type::kCollect, 7);
  std::string f = wire::encode_frame(m);
  REQUIRE(f.size() > 4);
  const std::string payload = f.substr(4);
  CHECK(f.substr(0, 4) == header(static_cast<std::uint32_t>(payload.size())));
  CHECK(json::parse(payload) == json{{"v", 1}, {"type", "collect"}, {"id", 7}});
}

TEST_CASE("the decoder accepts every split of a stream of frames", "[wire]") {
  std::string stream;
  std::vector<std::string> want;
  for (int i = 0; i < 3; ++i) {
    json m = wire::make_ack(static_cast<std::uint64_t>(i), json{{"n", std::string(i * 5, 'x')}});
    want.push_back(m.dump());
    REQUIRE(wire::append_frame(m, stream).is_ok());
  }
  REQUIRE(wire::append_raw_frame("", stream).is_ok());  // empty frames are frames too
  want.push_back("");
  for (std::size_t a = 0; a <= stream.size(); ++a) {
    for (std::size_t b = a; b <= stream.size(); b += 3) {
      FrameDecoder d;
      std::vector<std::string> got;
      d.feed(stream.substr(0, a));
      for (auto& p : drain(d)) got.push_back(p);
      d.feed(stream.substr(a, b - a));
      for (auto& p : drain(d)) got.push_back(p);
      d.feed(stream.substr(b));
      for (auto& p : drain(d)) got.push_back(p);
      REQUIRE(got == want);
      REQUIRE_FALSE(d.mid_frame());
    }
  }
  // One byte at a time.
  FrameDecoder d;
  std::vector<std::string> got;
  for (char c : stream) {
    d.feed(&c, 1);
    for (auto& p : drain(d)) got.push_back(p);
  }
  CHECK(got == want);
}

TEST_CASE("a truncated frame waits for the rest and reports mid-frame", "[wire]") {
  FrameDecoder d;
  std::string f = wire::encode_frame(wire::make_ack(1));
  d.feed(f.substr(0, 2));
  std::string p;
  Status err;
  CHECK(d.next(&p, &err) == FrameDecoder::Result::kNeedMore);
  CHECK(d.mid_frame());
  d.feed(f.substr(2, f.size() - 3));
  CHECK(d.next(&p, &err) == FrameDecoder::Result::kNeedMore);
  CHECK(d.buffered() == f.size() - 1);
  d.feed(f.substr(f.size() - 1));
  CHECK(d.next(&p, &err) == FrameDecoder::Result::kFrame);
  CHECK_FALSE(d.mid_frame());
}

TEST_CASE("an oversized frame is refused from its header and the decoder stays failed", "[wire]") {
  FrameDecoder d(1024);
  d.feed(header(1025));
  std::string p;
  Status err;
  REQUIRE(d.next(&p, &err) == FrameDecoder::Result::kError);
  CHECK(err.code() == Code::kInvalidArgument);
  CHECK_THAT(err.message(), Catch::Contains("1025 bytes exceeds the limit of 1024"));
  CHECK(d.failed());
  d.feed(wire::encode_frame(wire::make_ack(1)));
  CHECK(d.next(&p, &err) == FrameDecoder::Result::kError);

  // Exactly the limit is fine; the encoder enforces the same limit.
  FrameDecoder ok(8);
  ok.feed(header(8) + "12345678");
  CHECK(ok.next(&p, &err) == FrameDecoder::Result::kFrame);
  std::string out;
  CHECK_FALSE(wire::append_raw_frame(std::string(9, 'x'), out, 8).is_ok());
  CHECK(out.empty());
  // A 4 GiB header is refused by the default limit.
  FrameDecoder big;
  big.feed(header(0xffffffffu));
  CHECK(big.next(&p, &err) == FrameDecoder::Result::kError);
}

TEST_CASE("parse_message validates version, type, id and required fields", "[wire]") {
  std::uint64_t id = 99;
  auto bad = [&](const std::string& text) {
    auto m = wire::parse_message(text, &id);
    REQUIRE_FALSE(m.is_ok());
    CHECK(m.status().code() == Code::kInvalidArgument);
    return m.status().message();
  };
  CHECK_THAT(bad("{\"v\": 1, \"type\": "), Catch::Contains("malformed JSON at byte"));
  CHECK(id == 0);
  CHECK_THAT(bad(""), Catch::Contains("empty frame"));
  CHECK_THAT(bad("[1, 2]"), Catch::Contains("must be a JSON object"));
  CHECK_THAT(bad(R"({"v": 2, "type": "ack", "id": 5})"),
             Catch::Contains("unsupported protocol version 2"));
  CHECK(id == 5);  // the id is known, so the error reply can name it
  CHECK_THAT(bad(R"({"type": "ack", "id": 5})"), Catch::Contains("missing field 'v'"));
  CHECK_THAT(bad(R"({"v": 1, "type": "ack"})"), Catch::Contains("missing field 'id'"));
  CHECK_THAT(bad(R"({"v": 1, "type": "ack", "id": -3})"), Catch::Contains("field 'id'"));
  CHECK_THAT(bad(R"({"v": 1, "type": "frobnicate", "id": 6})"),
             Catch::Contains("unknown message type 'frobnicate'"));
  CHECK(id == 6);
  CHECK_THAT(bad(R"({"v": 1, "type": "hello", "id": 1, "pid": 3, "protocol": 1})"),
             Catch::Contains("hello: missing field 'name'"));
  CHECK_THAT(bad(R"({"v": 1, "type": "hello", "id": 1, "name": "a", "pid": 3, "protocol": 9})"),
             Catch::Contains("unsupported protocol version 9"));
  CHECK_THAT(
      bad(R"({"v":1,"type":"hello","id":1,"name":"a","pid":3,"protocol":1,"labels":{"x":1}})"),
      Catch::Contains("labels.x"));
  CHECK_THAT(bad(R"({"v":1,"type":"hello","id":1,"name":"a","pid":3,"protocol":1,"board":5})"),
             Catch::Contains("hello: field 'board': expected an object, got number"));
  CHECK_THAT(
      bad(R"({"v":1,"type":"hello","id":1,"name":"a","pid":3,"protocol":1,"board":{"bytes":1}})"),
      Catch::Contains("hello: board: missing field 'layout'"));
  CHECK_THAT(bad(R"({"v":1,"type":"hello","id":1,"name":"a","pid":3,"protocol":1,)"
                 R"("board":{"layout":"one","bytes":1}})"),
             Catch::Contains("hello: board: field 'layout': expected an integer, got string"));
  CHECK_THAT(bad(R"({"v": 1, "type": "rules", "id": 1, "rules": 5})"),
             Catch::Contains("field 'rules': expected a rules batch"));
  CHECK_THAT(bad(R"({"v": 1, "type": "apply_rules", "id": 1, "rules": []})"),
             Catch::Contains("apply_rules: missing field 'stage'"));
  CHECK_THAT(bad(R"({"v": 1, "type": "policy_set", "id": 1, "policy": "x"})"),
             Catch::Contains("field 'policy': expected an object"));
  CHECK_THAT(bad(std::string(100, '[') + std::string(100, ']')),
             Catch::Contains("nested deeper than"));
  CHECK_THAT(bad("{\"v\": 1, \"type\": \"ack\", \"id\": 1, \"x\": \"\xff\"}"),
             Catch::Contains("malformed JSON"));

  auto ok = wire::parse_message(
      R"({"v":1,"type":"hello","id":3,"name":"db","pid":42,"uid":0,"protocol":1,"labels":{"app":"x"}})",
      &id);
  REQUIRE(ok.is_ok());
  CHECK(ok->type == wire::Type::kHello);
  CHECK(ok->id == 3);
  CHECK(ok->body["labels"]["app"] == "x");
  // A stage's offer of its board: what ControlClient sends.
  json offered = {{"v", 1},
                  {"type", "hello"},
                  {"id", 4},
                  {"name", "db"},
                  {"pid", 42},
                  {"protocol", 1},
                  {"board", wire::board_offer()}};
  auto with_board = wire::parse_message(offered.dump());
  REQUIRE(with_board.is_ok());
  CHECK(with_board->body["board"] ==
        json{{"layout", sluice::kBoardLayoutVersion}, {"bytes", sluice::kBoardBytes}});
}

TEST_CASE("every type name round-trips and errors carry their code", "[wire]") {
  for (int i = 0; i < wire::kTypeCount; ++i) {
    auto t = static_cast<wire::Type>(i);
    auto back = wire::parse_type(wire::type_name(t));
    REQUIRE(back);
    CHECK(*back == t);
  }
  CHECK_FALSE(wire::parse_type("nope"));
  json e = wire::make_error(4, Status::not_found("no stage named 'x'"));
  CHECK(e["type"] == "error");
  CHECK(e["id"] == 4);
  auto m = wire::message_from_json(e);
  REQUIRE(m.is_ok());
  Status s = wire::error_status(e);
  CHECK(s.code() == Code::kNotFound);
  CHECK(s.message() == "no stage named 'x'");
  // Strings that are not UTF-8 do not make encoding throw.
  std::string out;
  CHECK(wire::append_frame(json{{"x", std::string("\xff\xfe")}}, out).is_ok());
}

TEST_CASE("nesting is limited to 64 levels; brackets inside strings do not count", "[wire]") {
  auto nested = [](int levels) {
    // The message object itself is the first level.
    return R"({"v":1,"type":"ack","id":1,"x":)" + std::string(levels - 1, '[') +
           std::string(levels - 1, ']') + "}";
  };
  CHECK(wire::parse_message(nested(64)).is_ok());
  auto deep = wire::parse_message(nested(65));
  REQUIRE_FALSE(deep.is_ok());
  CHECK_THAT(deep.status().message(), Catch::Contains("nested deeper than 64"));
  auto strings = wire::parse_message(R"({"v":1,"type":"ack","id":1,"x":")" + std::string(100, '[') +
                                     R"(\"{{{{","y":"]]]"})");
  REQUIRE(strings.is_ok());
  CHECK(strings->body["x"].get<std::string>().size() == 105);
  // A syntax error is still reported as one.
  auto broken = wire::parse_message(R"({"v":1,"type":"ack","id":1,"x":[}])");
  REQUIRE_FALSE(broken.is_ok());
  CHECK_THAT(broken.status().message(), Catch::Contains("malformed JSON at byte"));
}

TEST_CASE("a shared frame is the same message with one member spliced in", "[wire]") {
  const json batch = {{"version", 1},
                      {"rules", {{{"rule", "create_channel"}, {"channel", "ch\xc3\xa9"}}}}};
  auto text = std::make_shared<const std::string>(wire::dump(batch));
  wire::SharedFrame f;
  REQUIRE(
      wire::make_shared_frame(wire::make_message(wire::Type::kRules, 9, json{{"decided_ns", 123}}),
                              "rules", text, f)
          .is_ok());
  CHECK(f.shared == text);  // the bytes are shared, not copied
  const std::string bytes = f.head + *f.shared + f.tail;
  CHECK(bytes.size() == f.size());
  FrameDecoder d;
  d.feed(bytes);
  auto payloads = drain(d);
  REQUIRE(payloads.size() == 1);
  auto m = wire::parse_message(payloads[0]);
  REQUIRE(m.is_ok());
  CHECK(m->type == wire::Type::kRules);
  CHECK(m->id == 9);
  CHECK(m->body ==
        wire::make_message(wire::Type::kRules, 9, json{{"decided_ns", 123}, {"rules", batch}}));
  // An empty message gets no stray comma.
  REQUIRE(wire::make_shared_frame(json::object(), "k", text, f).is_ok());
  CHECK(json::parse((f.head + *f.shared + f.tail).substr(4)) == json{{"k", batch}});
  // The frame limit counts the whole payload; the key may not be there already.
  CHECK_THAT(wire::make_shared_frame(json{{"a", 1}}, "rules", text, f, text->size()).message(),
             Catch::Contains("exceeds the limit"));
  CHECK_FALSE(wire::make_shared_frame(json{{"rules", 1}}, "rules", text, f).is_ok());
}

TEST_CASE("a rules ack is built byte for byte as append_frame builds it", "[wire]") {
  for (auto [id, version] : {std::pair<std::uint64_t, std::uint64_t>{0, 0},
                             {7, 5},
                             {~std::uint64_t{0}, ~std::uint64_t{0}}}) {
    std::string want, got = "xy";  // appends
    REQUIRE(wire::append_frame(wire::make_ack(id, json{{"rules_version", version}}), want).is_ok());
    wire::append_rules_ack_frame(id, version, got);
    CHECK(got == "xy" + want);
  }
}

TEST_CASE("a rules frame is built byte for byte as make_shared_frame builds it", "[wire]") {
  const json batch = {{"version", 1},
                      {"rules",
                       {{{"rule", "configure"},
                         {"channel", "all"},
                         {"object", "limit"},
                         {"config", {{"rate", 1e12}}}}}}};
  auto text = std::make_shared<const std::string>(wire::dump(batch));
  for (auto [id, decided] : {std::pair<std::uint64_t, std::int64_t>{0, 0},
                             {7, 81234567890123},
                             {~std::uint64_t{0}, std::numeric_limits<std::int64_t>::min()},
                             {1, std::numeric_limits<std::int64_t>::max()}}) {
    wire::SharedFrame want, got;
    REQUIRE(wire::make_shared_frame(
                wire::make_message(wire::Type::kRules, id, json{{"decided_ns", decided}}), "rules",
                text, want)
                .is_ok());
    REQUIRE(wire::make_rules_frame(id, decided, text, got).is_ok());
    CHECK(got.head + *got.shared + got.tail == want.head + *want.shared + want.tail);
    CHECK(got.shared == text);
  }
  wire::SharedFrame f;
  CHECK_THAT(wire::make_rules_frame(1, 1, text, f, text->size()).message(),
             Catch::Contains("exceeds the limit"));
  CHECK_FALSE(wire::make_rules_frame(1, 1, nullptr, f).is_ok());
}

TEST_CASE("parse_message and read_rules read what make_rules_frame wrote", "[wire][rules]") {
  for (const json& batch :
       {json::array(), json::parse(R"([{"rule":"configure","channel":"a","object":"b",
                                         "config":{"rate":1e12}}])"),
        json::parse(R"({"version":1,"rules":[]})")}) {
    auto text = std::make_shared<const std::string>(wire::dump(batch));
    for (auto [id, decided] : {std::pair<std::uint64_t, std::int64_t>{0, 0},
                               {7, 81234567890123},
                               {~std::uint64_t{0}, std::numeric_limits<std::int64_t>::min()},
                               {1, std::numeric_limits<std::int64_t>::max()},
                               {10, -1}}) {
      wire::SharedFrame f;
      REQUIRE(wire::make_rules_frame(id, decided, text, f).is_ok());
      const std::string payload = f.head.substr(wire::kHeaderSize) + *f.shared + f.tail;
      auto m = wire::parse_message(payload);
      REQUIRE(m.is_ok());
      CHECK(m->type == wire::Type::kRules);
      auto r = wire::read_rules(*m);
      REQUIRE(r);
      CHECK(r->id == id);
      CHECK(r->decided_ns == decided);
      REQUIRE(r->rules != nullptr);
      CHECK(*r->rules == batch);
      CHECK(wire::dump(*r->rules) == *text);
      CHECK_FALSE(wire::read_rules_ack(*m));
    }
  }
}

TEST_CASE("rules messages in any form are read alike, and refused with the reason",
          "[wire][rules]") {
  // What a peer may write besides make_rules_frame's form: member order,
  // blanks, a decided_ns that is not an int64 integer (informational: read
  // as 0).
  const std::pair<const char*, std::int64_t> accepted[] = {
      {R"({"id":1,"decided_ns":2,"type":"rules","v":1,"rules":[]})", 2},
      {R"({"decided_ns": 2,"id":1,"type":"rules","v":1,"rules":[]})", 2},
      {R"( {"v":1, "rules":[], "type":"rules", "id":1, "decided_ns":-5} )", -5},
      {R"({"id":1,"type":"rules","v":1,"rules":[]})", 0},
      {R"({"decided_ns":2.0,"id":1,"type":"rules","v":1,"rules":[]})", 0},
      {R"({"decided_ns":2e3,"id":1,"type":"rules","v":1,"rules":[]})", 0},
      {R"({"decided_ns":"2","id":1,"type":"rules","v":1,"rules":[]})", 0},
      {R"({"decided_ns":9223372036854775808,"id":1,"type":"rules","v":1,"rules":[]})", 0},
      {R"({"decided_ns":-9223372036854775809,"id":1,"type":"rules","v":1,"rules":[]})", 0},
  };
  for (const auto& [payload, decided] : accepted) {
    INFO(payload);
    auto m = wire::parse_message(payload);
    REQUIRE(m.is_ok());
    auto r = wire::read_rules(*m);
    REQUIRE(r);
    CHECK(r->id == 1);
    CHECK(r->decided_ns == decided);
    CHECK(*r->rules == json::array());
  }
  const std::pair<const char*, const char*> refused[] = {
      {R"({"decided_ns":02,"id":1,"type":"rules","v":1,"rules":[]})",
       "malformed JSON at byte 16: syntax error while parsing object - unexpected number "
       "literal; expected '}'"},
      {R"({"decided_ns":-,"id":1,"type":"rules","v":1,"rules":[]})",
       "malformed JSON at byte 16: syntax error while parsing value - invalid number; expected "
       "digit after '-'; last read: '-,'"},
      {R"({"decided_ns":2,"id":-1,"type":"rules","v":1,"rules":[]})",
       "field 'id': expected an integer >= 0, got -1"},
      {R"({"decided_ns":2,"id":18446744073709551616,"type":"rules","v":1,"rules":[]})",
       "field 'id': expected an integer >= 0, got 1.8446744073709552e+19"},
      {R"({"decided_ns":2,"id":1,"type":"rules","v":2,"rules":[]})",
       "unsupported protocol version 2 (this side speaks 1)"},
      {R"({"decided_ns":2,"id":1,"type":"rules","v":1,"rules":"x"})",
       R"(rules: field 'rules': expected a rules batch (an array or {"version": 1, "rules": [...]}), got string)"},
      {R"({"decided_ns":2,"id":1,"type":"rules","v":1})", "rules: missing field 'rules'"},
      {R"({"decided_ns":2,"id":1,"type":"rules","v":1,"rules":[])",
       "malformed JSON at byte 55: syntax error while parsing object - unexpected end of input; "
       "expected '}'"},
      {R"({"decided_ns":2,"id":1,"type":"rules","v":1,"rules":})",
       "malformed JSON at byte 53: syntax error while parsing value - unexpected '}'; expected "
       "'[', '{', or a literal"},
      {"", "malformed JSON: empty frame"},
  };
  for (const auto& [payload, error] : refused) {
    INFO(payload);
    auto m = wire::parse_message(payload);
    REQUIRE_FALSE(m.is_ok());
    CHECK(m.status().code() == Code::kInvalidArgument);
    CHECK(m.status().message() == error);
  }
  // Another type with the same members is that type, not rules.
  auto m = wire::parse_message(R"({"decided_ns":2,"id":1,"type":"collect","v":1,"rules":[]})");
  REQUIRE(m.is_ok());
  CHECK(m->type == wire::Type::kCollect);
  CHECK_FALSE(wire::read_rules(*m));
}

TEST_CASE("every truncation of a rules frame is refused at the byte where it ends",
          "[wire][rules]") {
  const std::string seed =
      R"({"decided_ns":-81234567890123,"id":42,"type":"rules","v":1,"rules":[{"channel":"all","config":{"rate":1000000000001.0},"object":"limit","rule":"configure"}]})";
  for (std::size_t n = 1; n < seed.size(); ++n) {
    INFO(seed.substr(0, n));
    auto m = wire::parse_message(seed.substr(0, n));
    REQUIRE_FALSE(m.is_ok());
    CHECK_THAT(m.status().message(),
               Catch::StartsWith("malformed JSON at byte " + std::to_string(n + 1) +
                                 ": syntax error while parsing "));
  }
  auto m = wire::parse_message(seed);
  REQUIRE(m.is_ok());
  auto r = wire::read_rules(*m);
  REQUIRE(r);
  CHECK(r->id == 42);
  CHECK(r->decided_ns == -81234567890123);
  CHECK((*r->rules)[0]["config"]["rate"] == 1000000000001.0);
}

TEST_CASE("write_rules_frame_head writes make_rules_frame's head, or refuses", "[wire]") {
  auto text = std::make_shared<const std::string>(R"([{"rule":"remove_channel","channel":"a"}])");
  for (auto [id, decided] : {std::pair<std::uint64_t, std::int64_t>{0, 0},
                             {7, 81234567890123},
                             {~std::uint64_t{0}, std::numeric_limits<std::int64_t>::min()}}) {
    wire::SharedFrame want;
    REQUIRE(wire::make_rules_frame(id, decided, text, want).is_ok());
    char head[wire::kRulesFrameHeadMax];
    const std::size_t n = wire::write_rules_frame_head(id, decided, text->size(), head);
    CHECK(std::string(head, n) == want.head);
    CHECK(want.tail == "}");
  }
  // The limit counts the whole payload: head, batch and the closing brace.
  char head[wire::kRulesFrameHeadMax];
  const std::size_t n = wire::write_rules_frame_head(1, 2, text->size(), head);
  const std::size_t payload = n - wire::kHeaderSize + text->size() + 1;
  CHECK(wire::write_rules_frame_head(1, 2, text->size(), head, payload) == n);
  CHECK(wire::write_rules_frame_head(1, 2, text->size(), head, payload - 1) == 0);
}

TEST_CASE("parse_message and read_rules_ack read what append_rules_ack_frame wrote",
          "[wire][rules]") {
  for (auto [id, version] : {std::pair<std::uint64_t, std::uint64_t>{0, 0},
                             {7, 5},
                             {~std::uint64_t{0}, ~std::uint64_t{0}}}) {
    std::string frame;
    wire::append_rules_ack_frame(id, version, frame);
    const std::string payload = frame.substr(wire::kHeaderSize);
    // The bytes append_frame(make_ack(...)) writes.
    CHECK(frame == wire::encode_frame(wire::make_ack(id, json{{"rules_version", version}})));
    auto m = wire::parse_message(payload);
    REQUIRE(m.is_ok());
    CHECK(m->type == wire::Type::kAck);
    auto a = wire::read_rules_ack(*m);
    REQUIRE(a);
    CHECK(a->id == id);
    CHECK(a->rules_version == version);
    CHECK_FALSE(wire::read_rules(*m));
  }
}

TEST_CASE("acks in any form are read alike, and what is not a rules ack is told apart",
          "[wire][rules]") {
  for (const char* payload : {R"({"id":1,"rules_version":2,"type":"ack","v":1} )",
                              R"({"id": 1,"rules_version":2,"type":"ack","v":1})",
                              R"({"rules_version":2,"id":1,"type":"ack","v":1})",
                              R"({"id":1,"rules_version":2,"type":"ack","v":1,"x":0})"}) {
    INFO(payload);
    auto m = wire::parse_message(payload);
    REQUIRE(m.is_ok());
    auto a = wire::read_rules_ack(*m);
    REQUIRE(a);
    CHECK(a->id == 1);
    CHECK(a->rules_version == 2);
  }
  // Acks without a rules version (a hello's) are acks, not rules acks.
  for (const char* payload :
       {R"({"id":1,"type":"ack","v":1})", R"({"id":1,"rules_version":-2,"type":"ack","v":1})",
        R"({"id":1,"rules_version":2.5,"type":"ack","v":1})",
        R"({"id":1,"rules_version":"2","type":"ack","v":1})"}) {
    INFO(payload);
    auto m = wire::parse_message(payload);
    REQUIRE(m.is_ok());
    CHECK(m->type == wire::Type::kAck);
    CHECK_FALSE(wire::read_rules_ack(*m));
  }
  const std::pair<const char*, const char*> refused[] = {
      {R"({"id":01,"rules_version":2,"type":"ack","v":1})",
       "malformed JSON at byte 8: syntax error while parsing object - unexpected number literal; "
       "expected '}'"},
      {R"({"id":1.0,"rules_version":2,"type":"ack","v":1})",
       "field 'id': expected an integer >= 0, got 1.0"},
      {R"({"id":-1,"rules_version":2,"type":"ack","v":1})",
       "field 'id': expected an integer >= 0, got -1"},
      {R"({"id":18446744073709551616,"rules_version":2,"type":"ack","v":1})",
       "field 'id': expected an integer >= 0, got 1.8446744073709552e+19"},
      {R"({"id":1,"rules_version":2,"type":"ack","v":2})",
       "unsupported protocol version 2 (this side speaks 1)"},
      {R"({"id":1,"rules_version":2,"type":"error","v":1})", "error: missing field 'message'"},
      {R"({"id":1,"rules_version":2,"type":"ack","v":1)",
       "malformed JSON at byte 45: syntax error while parsing object - unexpected end of input; "
       "expected '}'"},
  };
  for (const auto& [payload, error] : refused) {
    INFO(payload);
    auto m = wire::parse_message(payload);
    REQUIRE_FALSE(m.is_ok());
    CHECK(m.status().message() == error);
  }
}

TEST_CASE("error codes travel in snake_case and read back, old spellings too", "[wire]") {
  const std::pair<Status, const char*> cases[] = {
      {Status::invalid("x"), "invalid_argument"},
      {Status::not_found("x"), "not_found"},
      {Status::exists("x"), "already_exists"},
      {Status::precondition("x"), "failed_precondition"},
      {Status::unavailable("x"), "unavailable"},
      {Status::cancelled("x"), "cancelled"},
      {Status::io_error("x"), "io_error"},
      {Status::internal("x"), "internal"},
      {Status::permission_denied("x"), "permission_denied"},
  };
  for (const auto& [status, name] : cases) {
    INFO(name);
    json e = wire::make_error(1, status);
    CHECK(e["code"] == name);
    CHECK(wire::error_status(e).code() == status.code());
    // What peers of earlier versions sent ("invalid argument", "I/O error").
    json old = e;
    old["code"] = std::string(sluice::code_name(status.code()));
    CHECK(wire::error_status(old).code() == status.code());
  }
  CHECK(wire::parse_code("no_such_code") == Code::kInternal);
}

TEST_CASE("errors echo values bounded, however large the peer made them", "[wire]") {
  json big = json::array();
  for (int i = 0; i < 500000; ++i) big.push_back(i);
  const std::size_t full = wire::dump(big).size();
  const std::string e = wire::echo(big);
  CHECK(e.size() <= wire::kMaxEcho + 32);
  CHECK_THAT(e, Catch::StartsWith("[0,1,2,3,") &&
                    Catch::EndsWith("... (" + std::to_string(full) + " bytes)"));
  CHECK(wire::echo(json{{"tenant", 1}}) == R"({"tenant":1})");  // small values whole
  // Cut at a character boundary, never inside a UTF-8 sequence.
  const std::string accents = wire::bound_text(std::string(300, 'a') + "\xc3\xa9\xc3\xa9", 301);
  CHECK_THAT(accents, Catch::StartsWith(std::string(300, 'a') + "... (304 bytes)"));
  // A whole message on the wire is bounded too, sent or received.
  json err = wire::make_error(3, Status::invalid(std::string(5 << 20, 'x')));
  CHECK(err["message"].get<std::string>().size() <= wire::kMaxErrorMessage + 32);
  json received = {{"type", "error"}, {"code", "internal"}, {"message", std::string(5 << 20, 'y')}};
  CHECK(wire::error_status(received).message().size() <= wire::kMaxErrorMessage + 32);
  // nlohmann's parse errors quote the token last read: a long one is cut.
  auto m = wire::parse_message("\"" + std::string(1 << 20, 'z'));
  REQUIRE_FALSE(m.is_ok());
  CHECK(m.status().message().size() < 1024);
}

TEST_CASE("the decoder gives a large frame's memory back once it is returned", "[wire]") {
  FrameDecoder d(8u << 20);
  const std::string payload(4u << 20, 'p');
  const std::string frame = header(static_cast<std::uint32_t>(payload.size())) + payload;
  // A header announcing 4 MiB reserves nothing.
  d.feed(frame.substr(0, 4));
  CHECK(d.capacity() <= FrameDecoder::kKeptCapacity);
  for (std::size_t at = 4; at < frame.size(); at += 65536) {
    d.feed(frame.substr(at, 65536));
  }
  CHECK(d.capacity() >= payload.size());
  std::string p;
  Status err;
  REQUIRE(d.next(&p, &err) == FrameDecoder::Result::kFrame);
  CHECK(p.size() == payload.size());
  CHECK(d.capacity() <= FrameDecoder::kKeptCapacity);
  // Small frames keep their small buffer (no allocation per frame).
  d.feed(wire::encode_frame(wire::make_ack(1)));
  REQUIRE(d.next(&p, &err) == FrameDecoder::Result::kFrame);
  CHECK(d.capacity() > 0);
}
