// Status and StatusOr: errors as values on every data and control path.
//
// A Status is cheap when OK (one pointer, no allocation) and carries a code and
// a message a user can act on when not. No exceptions cross Sluice's data
// paths; configuration parsing catches what nlohmann_json throws and turns it
// into a Status that names the offending field.
//
// Thread safety: Status and StatusOr are values; distinct instances may be used
// from distinct threads freely, one instance is not synchronised.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace sluice {

enum class Code : unsigned char {
  kOk = 0,
  kInvalidArgument,  // malformed input: a rule, a message, a configuration
  kNotFound,         // a named channel, object, stage or type does not exist
  kAlreadyExists,    // creating something that is already there
  kFailedPrecondition,
  kUnavailable,  // a peer is gone or not reachable (yet)
  kCancelled,    // the operation was abandoned (object removed, stage closed)
  kIoError,
  // A request was delivered but not confirmed in time: it may still take
  // effect (rules sent to a stopped stage apply when it resumes).
  kPending,
  kInternal,
  kPermissionDenied,  // the peer may not do this (docs/protocol.md, "Who may do what")
};

std::string_view code_name(Code c) noexcept;

class [[nodiscard]] Status {
 public:
  Status() noexcept = default;
  Status(Code code, std::string message);

  static Status ok() noexcept { return {}; }
  static Status invalid(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status not_found(std::string m) { return {Code::kNotFound, std::move(m)}; }
  static Status exists(std::string m) { return {Code::kAlreadyExists, std::move(m)}; }
  static Status precondition(std::string m) { return {Code::kFailedPrecondition, std::move(m)}; }
  static Status unavailable(std::string m) { return {Code::kUnavailable, std::move(m)}; }
  static Status cancelled(std::string m) { return {Code::kCancelled, std::move(m)}; }
  static Status io_error(std::string m) { return {Code::kIoError, std::move(m)}; }
  static Status pending(std::string m) { return {Code::kPending, std::move(m)}; }
  static Status internal(std::string m) { return {Code::kInternal, std::move(m)}; }
  static Status permission_denied(std::string m) { return {Code::kPermissionDenied, std::move(m)}; }

  bool is_ok() const noexcept { return rep_ == nullptr; }
  explicit operator bool() const noexcept { return is_ok(); }
  Code code() const noexcept { return rep_ ? rep_->code : Code::kOk; }
  // The message alone ("" when OK).
  const std::string& message() const noexcept;
  // "<code name>: <message>", or "ok".
  std::string to_string() const;

  // Prefix the message with context, e.g. "rules[3]: " + message.
  Status with_prefix(std::string_view prefix) const;

  Status(const Status& o) : rep_(o.rep_ ? std::make_unique<Rep>(*o.rep_) : nullptr) {}
  Status& operator=(const Status& o) {
    if (this != &o) rep_ = o.rep_ ? std::make_unique<Rep>(*o.rep_) : nullptr;
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

 private:
  struct Rep {
    Code code;
    std::string message;
  };
  std::unique_ptr<Rep> rep_;
};

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  StatusOr(Status s) : v_(std::move(s)) {}     // NOLINT(google-explicit-constructor)

  bool is_ok() const noexcept { return std::holds_alternative<T>(v_); }
  explicit operator bool() const noexcept { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace sluice

// Return early from a function returning Status (or StatusOr) when an
// expression yields a non-OK Status.
#define SLUICE_RETURN_IF_ERROR(expr)                    \
  do {                                                  \
    ::sluice::Status sluice_status_ = (expr);           \
    if (!sluice_status_.is_ok()) return sluice_status_; \
  } while (0)
