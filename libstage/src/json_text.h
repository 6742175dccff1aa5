// Small scanners over JSON text as the protocol's peers write it (wire::dump's
// compact output), shared by the quick parser (wire.cc) and the compact rules
// parser (rules.cc). Internal to libstage.
#pragma once

#include <cstddef>
#include <cstring>
#include <string_view>

namespace sluice::detail {

// The contents of a JSON string from `p`, just past its opening quote, when
// they are printable ASCII without escapes: true, with `out` set to them and
// `p` past the closing quote. False for anything else (an escape, a control
// or non-ASCII byte, no closing quote); `p` is then unspecified.
inline bool scan_plain_string(const char*& p, const char* end, std::string_view& out) {
  const char* start = p;
  for (; p != end; ++p) {
    const auto c = static_cast<unsigned char>(*p);
    if (c == '"') {
      out = std::string_view(start, static_cast<std::size_t>(p - start));
      ++p;
      return true;
    }
    if (c < 0x20 || c >= 0x7f || c == '\\') return false;
  }
  return false;
}

// `word` (true, false, null) at `p`: true with `p` past it; false, `p` unmoved,
// otherwise. What follows the word is not read. (A literal's length known at
// compile time lets the compare inline.)
template <std::size_t N>
bool scan_literal(const char*& p, const char* end, const char (&word)[N]) {
  if (static_cast<std::size_t>(end - p) < N - 1 || std::memcmp(p, word, N - 1) != 0) return false;
  p += N - 1;
  return true;
}

}  // namespace sluice::detail
