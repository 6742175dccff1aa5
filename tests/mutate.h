// Deterministic damage to texts, for the tests that hold a fast parser to the
// general one on broken input: a fixed seed, so that every run checks the
// same texts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sluice::testing {

class Mutator {
 public:
  explicit Mutator(std::uint64_t seed) : state_(seed) {}

  // xorshift64: the next pseudo-random number.
  std::uint64_t next() {
    state_ ^= state_ << 13;
    state_ ^= state_ >> 7;
    state_ ^= state_ << 17;
    return state_;
  }

  // `text` after `edits` one-byte edits at random places: a byte of
  // `alphabet` inserted, a byte erased, or a byte replaced.
  std::string mutate(std::string text, std::string_view alphabet, int edits = 1) {
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = text.empty() ? 0 : next() % (text.size() + 1);
      const char c = alphabet[next() % alphabet.size()];
      switch (next() % 3) {
        case 0:
          text.insert(text.begin() + static_cast<std::ptrdiff_t>(at), c);
          break;
        case 1:
          if (at < text.size()) text.erase(at, 1);
          break;
        default:
          if (at < text.size()) text[at] = c;
          break;
      }
    }
    return text;
  }

 private:
  std::uint64_t state_;
};

}  // namespace sluice::testing
