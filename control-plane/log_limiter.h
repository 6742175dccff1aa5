// Rate limits for the daemon's messages about what peers do (a bad frame, a
// refused uid, a timeout, ...): any admitted peer can cause those as often as
// it likes, and one line each would let it grow the log without bound.
//
// Each kind of message has a token bucket (by default 10 lines at once, then
// 1 a second). A message that finds its bucket empty is counted, not logged;
// the next one logged of that kind says how many were suppressed before it,
// and take_summaries() reports the rest once tokens are back. Every message
// is counted, logged or not (counts(), in `policy show`'s metrics).
//
// Time is passed in (steady nanoseconds), so tests drive it directly.
//
// Thread safety: none; the daemon uses one from its loop thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace sluice::control {

class LogLimiter {
 public:
  struct Limit {
    double per_second = 1.0;  // tokens added per second
    double burst = 10.0;      // the bucket's size (and its content at first)
  };

  LogLimiter() = default;
  explicit LogLimiter(Limit default_limit) : default_(default_limit) {}

  // Sets the limit of one kind (before its first message; later calls
  // refill its bucket to the new size).
  void set_limit(std::string_view kind, Limit limit);

  // Whether a message of `kind` may be logged at `now_ns`. When it may,
  // *suppressed (if given) receives the number of messages of this kind
  // suppressed since the last one logged or summarised, and that count is
  // reset.
  bool admit(std::string_view kind, std::int64_t now_ns, std::uint64_t* suppressed = nullptr);

  // For each kind with suppressed messages not yet reported and a token to
  // spend on saying so: the kind and how many. Their counts are reset.
  std::vector<std::pair<std::string, std::uint64_t>> take_summaries(std::int64_t now_ns);

  // {kind: {"logged": n, "suppressed": m}} since construction.
  nlohmann::json counts() const;
  std::uint64_t suppressed_total() const noexcept { return suppressed_total_; }

 private:
  struct Bucket {
    Limit limit;
    double tokens = 0;
    std::int64_t refilled_ns = 0;
    bool started = false;
    std::uint64_t pending = 0;  // suppressed, not yet reported
    std::uint64_t logged = 0;
    std::uint64_t suppressed = 0;
  };
  Bucket& bucket(std::string_view kind);
  static void refill(Bucket& b, std::int64_t now_ns);

  Limit default_;
  std::map<std::string, Bucket, std::less<>> buckets_;
  std::uint64_t suppressed_total_ = 0;
};

}  // namespace sluice::control
