#include "sluice/json_text.h"

namespace sluice {

bool json_depth_within(std::string_view text, int max) noexcept {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // whatever is escaped, it does not end the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > max) return false;
        break;
      case ']':
      case '}':
        --depth;
        break;
      default:
        break;
    }
  }
  return true;
}

std::string json_error_text(const nlohmann::json::exception& e) {
  std::string m = e.what();
  const std::string key = "; last read: '";
  const std::size_t from = m.find(key);
  if (from == std::string::npos) return m;
  // The quoted token runs to the quote before the parser's own "; expected
  // ..." (which names token kinds, not input), or to the message's end.
  const std::size_t expected = m.rfind("'; expected ");
  const std::size_t to =
      expected != std::string::npos && expected >= from + key.size() ? expected + 1 : m.size();
  m.erase(from, to - from);
  return m;
}

StatusOr<nlohmann::json> parse_json_text(std::string_view text) {
  if (!json_depth_within(text)) {
    return Status::invalid("invalid JSON: nested deeper than " + std::to_string(kMaxJsonDepth) +
                           " levels of arrays and objects");
  }
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return Status::invalid("invalid JSON: " + json_error_text(e));
  } catch (const nlohmann::json::exception&) {  // a number out of range
    return Status::invalid("invalid JSON: a number is out of range");
  }
}

}  // namespace sluice
