#include "sluice/status.h"

namespace sluice {

std::string_view code_name(Code c) noexcept {
  switch (c) {
    case Code::kOk:
      return "ok";
    case Code::kInvalidArgument:
      return "invalid argument";
    case Code::kNotFound:
      return "not found";
    case Code::kAlreadyExists:
      return "already exists";
    case Code::kFailedPrecondition:
      return "failed precondition";
    case Code::kUnavailable:
      return "unavailable";
    case Code::kCancelled:
      return "cancelled";
    case Code::kIoError:
      return "I/O error";
    case Code::kPending:
      return "pending";
    case Code::kInternal:
      return "internal error";
    case Code::kPermissionDenied:
      return "permission denied";
  }
  return "unknown";
}

Status::Status(Code code, std::string message)
    : rep_(code == Code::kOk ? nullptr : std::make_unique<Rep>(Rep{code, std::move(message)})) {}

const std::string& Status::message() const noexcept {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

std::string Status::to_string() const {
  if (!rep_) return "ok";
  std::string s(code_name(rep_->code));
  s += ": ";
  s += rep_->message;
  return s;
}

Status Status::with_prefix(std::string_view prefix) const {
  if (!rep_) return {};
  std::string m(prefix);
  m += rep_->message;
  return {rep_->code, std::move(m)};
}

}  // namespace sluice
