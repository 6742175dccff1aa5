// Fuzzes the frame decoder with arbitrary bytes split at arbitrary points: the
// frames it yields must not depend on the split, and every payload must parse
// into a message or an error without crashing.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sluice/wire.h"

namespace wire = sluice::wire;

namespace {

// Returns the frames, and whether the decoder failed.
std::vector<std::string> decode(const std::string& bytes, const std::vector<std::size_t>& cuts,
                                bool* failed) {
  wire::FrameDecoder d(4096);
  std::vector<std::string> frames;
  std::size_t at = 0;
  std::string p;
  sluice::Status err;
  *failed = false;
  auto drain = [&] {
    for (;;) {
      auto r = d.next(&p, &err);
      if (r == wire::FrameDecoder::Result::kFrame) {
        frames.push_back(p);
      } else {
        if (r == wire::FrameDecoder::Result::kError) *failed = true;
        return;
      }
    }
  };
  for (std::size_t c : cuts) {
    if (c < at || c > bytes.size()) continue;
    d.feed(bytes.data() + at, c - at);
    at = c;
    drain();
    if (*failed) return frames;
  }
  d.feed(bytes.data() + at, bytes.size() - at);
  drain();
  return frames;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  // The first byte chooses the split pattern; the rest is the stream.
  const unsigned step = data[0] % 17 + 1;
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<std::size_t> cuts;
  for (std::size_t c = step; c < bytes.size(); c += step + (c % 5)) cuts.push_back(c);

  bool failed_whole = false, failed_split = false;
  auto whole = decode(bytes, {}, &failed_whole);
  auto split = decode(bytes, cuts, &failed_split);
  if (whole != split || failed_whole != failed_split) __builtin_trap();

  for (const auto& payload : whole) {
    std::uint64_t id = 0;
    auto m = wire::parse_message(payload, &id);
    std::string out;
    if (!m) {
      if (!wire::append_frame(wire::make_error(id, m.status()), out).is_ok()) __builtin_trap();
      continue;
    }
    // A valid message survives re-encoding.
    if (!wire::append_frame(m->body, out).is_ok()) __builtin_trap();
    auto again = wire::parse_message(std::string_view(out).substr(wire::kHeaderSize));
    if (!again || again->type != m->type || again->id != m->id) __builtin_trap();
  }
  return 0;
}
