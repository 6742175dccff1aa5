// The control plane's JSON reader (libstage/internal/sluice/wire.h):
// parse_message reads every message, rules and acks included, as nlohmann's
// parser does: the same types and numbers, the last of duplicate members,
// strings decoded; what nlohmann refuses, or nests deeper than 64 levels, is
// refused. Checked on a corpus of texts, their truncations and mutations.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "mutate.h"
#include "sluice/wire.h"

using nlohmann::json;
namespace wire = sluice::wire;

namespace {

// Equal values of equal types all the way down (json's operator== calls 1
// and 1u and 1.0 equal; the protocol's checks do not).
bool same(const json& a, const json& b) {
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case json::value_t::object: {
      if (a.size() != b.size()) return false;
      for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib) {
        if (ia.key() != ib.key() || !same(*ia, *ib)) return false;
      }
      return true;
    }
    case json::value_t::array:
      if (a.size() != b.size()) return false;
      for (std::size_t i = 0; i < a.size(); ++i) {
        if (!same(a[i], b[i])) return false;
      }
      return true;
    case json::value_t::number_float: {
      const double x = a.get<double>(), y = b.get<double>();
      return std::memcmp(&x, &y, sizeof x) == 0;  // -0.0 is not 0.0
    }
    default:
      return a == b;
  }
}

// How deep a value nests (a scalar: 0).
int depth(const json& v) {
  int d = 0;
  if (v.is_structured()) {
    for (const auto& e : v) d = std::max(d, depth(e));
    ++d;
  }
  return d;
}

// The property, for one text: parse_message gives what message_from_json
// gives for nlohmann's value of the text, when nlohmann parses it within 64
// levels; else a "malformed JSON" error. Returns whether nlohmann parsed it.
bool parses_as_nlohmann(const std::string& text) {
  INFO("text: " << text);
  std::uint64_t id_got = 0, id_want = 0;
  auto got = wire::parse_message(text, &id_got);
  json value;
  try {
    value = json::parse(text);
  } catch (const json::exception&) {
    REQUIRE_FALSE(got.is_ok());
    CHECK_THAT(got.status().message(), Catch::StartsWith("malformed JSON"));
    CHECK(id_got == 0);
    return false;
  }
  if (depth(value) > 64) {
    REQUIRE_FALSE(got.is_ok());
    CHECK(got.status().message() == "malformed JSON: nested deeper than 64 levels");
    return true;
  }
  auto want = wire::message_from_json(value, &id_want);
  REQUIRE(got.is_ok() == want.is_ok());
  CHECK(id_got == id_want);
  if (got.is_ok()) {
    CHECK(got->type == want->type);
    CHECK(got->id == want->id);
    CHECK(same(got->body, want->body));
  } else {
    CHECK(got.status().message() == want.status().message());
    CHECK(got.status().code() == want.status().code());
  }
  return true;
}

std::vector<std::string> json_corpus() {
  std::vector<std::string> c = {
      // What peers send.
      R"({"decided_ns":1234567890123,"id":2,"type":"rules","v":1,"rules":[{"channel":"all","config":{"rate":1000000000001.0},"object":"limit","rule":"configure"}]})",
      R"({"decided_ns":5,"id":3,"type":"rules","v":1,"rules":{"rules":[{"channel":"all","default":true,"rule":"create_channel"},{"channel":"all","config":{"rate":1e12},"object":"limit","rule":"create_object","type":"drl"}],"version":1}})",
      R"({"id":7,"rules_version":3,"type":"ack","v":1})", R"({"id":1,"type":"collect","v":1})",
      R"({"id":4,"info":{"labels":{},"pid":12},"stats":{"channels":[],"ops":0.5},"type":"stats","v":1})",
      R"({"id":1,"info":null,"name":"sim-0","pid":1,"protocol":1,"type":"hello","v":1,"x":[true,false,null]})",
      // Whitespace, empties, scalars, duplicates.
      " { \"a\" : [ 1 , 2 ] ,\n\t\"b\" : { } , \"c\" : [ ] } \r\n", "{}", "[]", "0", "\"\"",
      "\"x\"", "true", "false", "null", R"({"a":1,"a":2})", R"({"a":{"b":1},"a":[2]})",
      // Numbers at the edges of each type.
      "0", "-0", "1", "-1", "0.0", "-0.0", "1.5", "-1.5e-3", "1e12", "1E+2", "2e-2", "0e5",
      "18446744073709551615", "18446744073709551616", "-9223372036854775808",
      "-9223372036854775809", "9223372036854775808", "1e308", "1e309", "1e400", "-1e400", "1e-400",
      "4.9e-324", "2.2250738585072014e-308", "0.1", "123456789012345678901234567890",
      "1.7976931348623157e308", "1.7976931348623159e308",
      // Escapes, control and non-ASCII bytes, a byte order mark.
      R"({"a":"tab\tescape"})", R"({"a":"caf\u00e9"})", "{\"a\":\"caf\xc3\xa9\"}",
      "{\"a\":\"\x01\"}", "{\"a\":\"\x7f\"}", "\xef\xbb\xbf{}", R"({"a":"\""})",
      // Malformed.
      "", " ", "{", "}", "[", "]", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "[1,]", "[,1]", "{,}",
      "{\"a\" 1}", "{a:1}", "{'a':1}", "01", "-", "+1", "1.", ".5", "1e", "1e+", "--1", "-a",
      "1.2.3", "tru", "truex", "nul", "nulll", "falsey", "[1 2]", "{} {}", "{}x", "\"abc",
      "[\"a\":1]", "{\"a\":1]", "[1}", "NaN", "Infinity", "-Infinity", "/*c*/{}", "{}//c",
      std::string("{\"a\":1}\0", 8), std::string("{\"a\":\"\0\"}", 8)};
  // Nesting around the limit.
  for (int d : {63, 64, 65, 200}) {
    c.push_back(std::string(static_cast<std::size_t>(d), '[') +
                std::string(static_cast<std::size_t>(d), ']'));
    std::string o;
    for (int i = 0; i < d; ++i) o += "{\"a\":";
    o += "1";
    o += std::string(static_cast<std::size_t>(d), '}');
    c.push_back(o);
  }
  return c;
}

}  // namespace

TEST_CASE("parse_message keeps each number's type and value, at the edges too", "[wire][json]") {
  auto x_of = [](const std::string& number) {
    const std::string text = R"({"id":1,"type":"collect","v":1,"x":)" + number + "}";
    INFO(text);
    auto m = wire::parse_message(text);
    REQUIRE(m.is_ok());
    return m->body.at("x");
  };
  const double min_denormal = std::numeric_limits<double>::denorm_min();
  const std::pair<const char*, json> numbers[] = {
      {"0", json(std::uint64_t{0})},
      {"-0", json(std::int64_t{0})},
      {"7", json(std::uint64_t{7})},
      {"-7", json(std::int64_t{-7})},
      {"18446744073709551615", json(std::numeric_limits<std::uint64_t>::max())},
      {"-9223372036854775808", json(std::numeric_limits<std::int64_t>::min())},
      // Integers beyond 64 bits become doubles.
      {"18446744073709551616", json(18446744073709551616.0)},
      {"-9223372036854775809", json(-9223372036854775809.0)},
      {"123456789012345678901234567890", json(1.2345678901234568e29)},
      {"1e12", json(1e12)},
      {"1E+2", json(100.0)},
      {"0.0", json(0.0)},
      {"-0.0", json(-0.0)},
      {"0.1", json(0.1)},
      {"-1.5e-3", json(-1.5e-3)},
      {"1000000000001.0", json(1000000000001.0)},
      {"1e308", json(1e308)},
      {"1.7976931348623157e308", json(std::numeric_limits<double>::max())},
      {"4.9e-324", json(min_denormal)},
      {"1e-400", json(0.0)},  // underflow: zero
  };
  for (const auto& [number, want] : numbers) {
    INFO(number);
    CHECK(same(x_of(number), want));
  }
  for (const char* number : {"1e309", "1e400", "-1e400", "1.7976931348623159e308"}) {
    auto m =
        wire::parse_message(std::string(R"({"id":1,"type":"collect","v":1,"x":)") + number + "}");
    REQUIRE_FALSE(m.is_ok());
    CHECK(
        m.status().message() ==
        std::string("malformed JSON: [json.exception.out_of_range.406] number overflow parsing '") +
            number + "'");
  }
}

TEST_CASE("parse_message decodes strings, keeps the last duplicate and skips blanks",
          "[wire][json]") {
  auto body = [](const std::string& text) {
    INFO(text);
    auto m = wire::parse_message(text);
    REQUIRE(m.is_ok());
    return m->body;
  };
  const std::string head = R"({"id":1,"type":"collect","v":1,"x":)";
  CHECK(body(head + R"("tab\tescape"})")["x"] == "tab\tescape");
  CHECK(body(head + R"("caf\u00e9"})")["x"] == "caf\xc3\xa9");
  CHECK(body(head + "\"caf\xc3\xa9\"}")["x"] == "caf\xc3\xa9");
  CHECK(body(head + R"("\""})")["x"] == "\"");
  CHECK(body(head + "\"\x7f\"}")["x"] == "\x7f");
  CHECK(body(head + R"(1,"x":2})")["x"] == 2);
  CHECK(body(head + R"({"b":1},"x":[2]})")["x"] == json::array({2}));
  CHECK(body("\xef\xbb\xbf" + head + "1}")["x"] == 1);  // a byte order mark
  CHECK(body(" { \"id\" : 1 ,\n\t\"type\" : \"collect\" , \"v\" : 1 , \"x\" : [ 1 , { } , [ ] ] } "
             "\r\n")["x"] == json::array({1, json::object(), json::array()}));
  auto m = wire::parse_message(head + "\"\x01\"}");
  REQUIRE_FALSE(m.is_ok());
  CHECK_THAT(m.status().message(),
             Catch::StartsWith("malformed JSON at byte 37: syntax error while parsing value - "
                               "invalid string: control character U+0001 (SOH) must be escaped"));
}

TEST_CASE("parse_message reads the corpus as nlohmann does", "[wire][json]") {
  std::size_t parsed = 0;
  for (const std::string& text : json_corpus()) parsed += parses_as_nlohmann(text);
  CHECK(parsed >= 50);
}

TEST_CASE("parse_message errors are unchanged for malformed frames", "[wire][json]") {
  // nlohmann's messages and byte positions, as the general parser gives them.
  auto bad = [](const std::string& text) {
    auto m = wire::parse_message(text);
    REQUIRE_FALSE(m.is_ok());
    return m.status().message();
  };
  CHECK(bad("") == "malformed JSON: empty frame");
  CHECK_THAT(bad(R"({"v":1,"type":"rules","id":1,"rules":[)"),
             Catch::StartsWith("malformed JSON at byte 39: syntax error"));
  CHECK_THAT(bad(R"({"v":1,"id":1,})"),
             Catch::StartsWith("malformed JSON at byte 15: syntax error"));
  CHECK_THAT(bad("01"), Catch::StartsWith("malformed JSON at byte 2: syntax error"));
  CHECK_THAT(bad("1e400"), Catch::Contains("number overflow"));
  CHECK_THAT(bad(std::string(65, '[') + std::string(65, ']')),
             Catch::Contains("nested deeper than 64 levels"));
  CHECK(bad(R"({"v":1,"type":"rules","id":-1,"rules":[]})") ==
        "field 'id': expected an integer >= 0, got -1");
  CHECK(bad(R"({"v":1,"type":"rules","id":18446744073709551616,"rules":[]})") ==
        "field 'id': expected an integer >= 0, got 1.8446744073709552e+19");
}

TEST_CASE("parse_message reads every truncation and mutation of the corpus as nlohmann does",
          "[wire][json]") {
  // Deterministic: a fixed seed and a fixed number of mutations.
  std::vector<std::string> seeds = json_corpus();
  sluice::testing::Mutator mutator(0x9e3779b97f4a7c15u);
  const std::string alphabet = "{}[]:,\"\\-+.0123456789eEtrufalsn \t\n\x01\x7f\xc3\xa9";
  std::size_t parsed = 0;
  for (const std::string& s : seeds) {
    for (std::size_t n = 0; n <= s.size(); ++n) parsed += parses_as_nlohmann(s.substr(0, n));
    for (int i = 0; i < 300; ++i) {
      const int edits = 1 + static_cast<int>(mutator.next() % 3);
      parsed += parses_as_nlohmann(mutator.mutate(s, alphabet, edits));
    }
  }
  CHECK(parsed > 1000);  // the comparison ran on parsed texts, not only refusals
}
