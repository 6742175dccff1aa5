// Reading JSON text that crossed a trust boundary (a rules or policy file, an
// etcd value, a frame, a reply): one depth limit and one way of reporting what
// is wrong, without ever throwing and without quoting the text (a file may be
// one its reader can read and its user cannot). Not installed.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "sluice/status.h"

namespace sluice {

// The deepest nesting of arrays and objects Sluice reads. None of its
// documents needs more than a dozen; the values it reads are walked by
// recursive code (validation, dump, copy), which must stay bounded.
inline constexpr int kMaxJsonDepth = 64;

// False when `text` opens more than `max` arrays or objects at once (brackets
// inside strings do not count). Malformed text is the parser's business.
bool json_depth_within(std::string_view text, int max = kMaxJsonDepth) noexcept;

// What a parse error says, without the token nlohmann quotes from the input
// ("; last read: '...'"): where (line and column) and what was expected.
std::string json_error_text(const nlohmann::json::exception& e);

// `text` as JSON, or an error whose message starts "invalid JSON: ": not JSON
// (json_error_text), nested deeper than kMaxJsonDepth, or a number out of
// range. The caller prefixes where the text came from.
StatusOr<nlohmann::json> parse_json_text(std::string_view text);

}  // namespace sluice
