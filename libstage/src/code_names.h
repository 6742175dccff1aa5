// The names of the status codes (sluice::Code), in one table: as messages
// say them (sluice::code_name, "invalid argument") and on the wire, in
// snake_case (wire::error_code_name, "invalid_argument"; wire::parse_code
// reads both back). Constant data: safe from any thread.
#pragma once

#include <cstddef>
#include <iterator>
#include <string_view>

#include "sluice/status.h"

namespace sluice::detail {

struct CodeName {
  Code code;
  std::string_view text;  // in messages and Status::to_string()
  std::string_view wire;  // in an error message's "code"
};

// One row per code, in the enum's order (a code added to sluice::Code gets
// its row here).
inline constexpr CodeName kCodeNames[] = {
    {Code::kOk, "ok", "ok"},
    {Code::kInvalidArgument, "invalid argument", "invalid_argument"},
    {Code::kNotFound, "not found", "not_found"},
    {Code::kAlreadyExists, "already exists", "already_exists"},
    {Code::kFailedPrecondition, "failed precondition", "failed_precondition"},
    {Code::kUnavailable, "unavailable", "unavailable"},
    {Code::kCancelled, "cancelled", "cancelled"},
    {Code::kIoError, "I/O error", "io_error"},
    {Code::kPending, "pending", "pending"},
    {Code::kInternal, "internal error", "internal"},
    {Code::kPermissionDenied, "permission denied", "permission_denied"},
};

constexpr bool code_names_in_order() noexcept {
  for (std::size_t i = 0; i < std::size(kCodeNames); ++i) {
    if (static_cast<std::size_t>(kCodeNames[i].code) != i) return false;
  }
  return true;
}
static_assert(code_names_in_order(), "kCodeNames: one row per Code, in the enum's order");

// The row of `c`; null for a value that names no code.
constexpr const CodeName* names_of(Code c) noexcept {
  const auto i = static_cast<std::size_t>(c);
  return i < std::size(kCodeNames) ? &kCodeNames[i] : nullptr;
}

}  // namespace sluice::detail
