#include "sluice/status.h"

#include "code_names.h"

namespace sluice {

std::string_view code_name(Code c) noexcept {
  const detail::CodeName* n = detail::names_of(c);
  return n != nullptr ? n->text : "unknown";
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
