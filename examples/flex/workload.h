// The pieces of examples/flex's node programs that are about the workload, not RocksDB:
// their keys and values, the latency histogram and YCSB's scrambled Zipfian key chooser.
//
// Thread safety: a Histogram or a Zipfian belongs to one thread (merge histograms after
// joining); Zipfian::next takes the caller's random engine.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>

#include "support/latency.h"

namespace sluice::examples::flex {

// Keys are "user" and 12 decimal digits (YCSB's shape), kKeySize bytes and a NUL.
constexpr int kKeySize = 16;

inline void encode_key(std::uint64_t k, char* out) {
  std::memcpy(out, "user", 4);
  for (int i = kKeySize; i-- > 4; k /= 10) out[i] = static_cast<char>('0' + k % 10);
  out[kKeySize] = '\0';
}

// A value of `size` bytes of the engine's output (incompressible, as the paper's).
inline std::string random_value(std::mt19937_64& rng, int size) {
  std::string v(static_cast<std::size_t>(size), '\0');
  for (std::size_t j = 0; j + 8 <= v.size(); j += 8) {
    const std::uint64_t x = rng();
    std::memcpy(v.data() + j, &x, 8);
  }
  return v;
}

// The examples' latency histogram, in microseconds (support/latency.h).
using Histogram = bench::LatencyHistogram;

// YCSB's ZipfianGenerator (Gray et al., "Quickly generating billion-record synthetic
// databases") over ranks [0, n), then scrambled as YCSB's ScrambledZipfianGenerator
// does (FNV-1a 64 of the rank, modulo n) so that the popular items are spread over the
// key space instead of being neighbours in one block.
class Zipfian {
 public:
  Zipfian(std::uint64_t n, double theta) : n_(std::max<std::uint64_t>(n, 2)), theta_(theta) {
    for (std::uint64_t i = 1; i <= n_; ++i) zetan_ += 1.0 / std::pow(static_cast<double>(i), theta);
    const double zeta2 = 1.0 + 1.0 / std::pow(2.0, theta);
    alpha_ = 1.0 / (1.0 - theta);
    eta_ = (1.0 - std::pow(2.0 / static_cast<double>(n_), 1.0 - theta)) / (1.0 - zeta2 / zetan_);
  }
  template <typename Rng>
  std::uint64_t next(Rng& rng) const {
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    const double uz = u * zetan_;
    std::uint64_t rank = 0;
    if (uz < 1.0) {
      rank = 0;
    } else if (uz < 1.0 + std::pow(0.5, theta_)) {
      rank = 1;
    } else {
      rank = static_cast<std::uint64_t>(static_cast<double>(n_) *
                                        std::pow(eta_ * u - eta_ + 1.0, alpha_));
    }
    return fnv1a(std::min(rank, n_ - 1)) % n_;
  }

 private:
  static std::uint64_t fnv1a(std::uint64_t v) noexcept {
    std::uint64_t h = 0xcbf29ce484222325ULL;
    for (int i = 0; i < 8; ++i) {
      h ^= v & 0xff;
      h *= 0x100000001b3ULL;
      v >>= 8;
    }
    return h;
  }
  std::uint64_t n_;
  double theta_;
  double zetan_ = 0;
  double alpha_ = 0;
  double eta_ = 0;
};

}  // namespace sluice::examples::flex
