// The names of the status codes: as messages and Status::to_string() say
// them, and on the wire (snake_case), each read back by wire::parse_code.
#include <catch2/catch.hpp>

#include <string>

#include "sluice/status.h"
#include "sluice/wire.h"

using sluice::Code;
using sluice::Status;

TEST_CASE("every status code has its message name and its wire name", "[status]") {
  struct Row {
    Code code;
    const char* text;
    const char* wire;
  };
  const Row rows[] = {
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
  for (const Row& r : rows) {
    INFO(r.wire);
    CHECK(sluice::code_name(r.code) == r.text);
    CHECK(sluice::wire::error_code_name(r.code) == r.wire);
    CHECK(sluice::wire::parse_code(r.wire) == r.code);
    CHECK(sluice::wire::parse_code(r.text) == r.code);
    if (r.code != Code::kOk) {
      CHECK(Status(r.code, "why").to_string() == std::string(r.text) + ": why");
    }
  }
  CHECK(Status::ok().to_string() == "ok");
}

TEST_CASE("a value that names no code reads as unknown, and as internal on the wire", "[status]") {
  const auto none = static_cast<Code>(200);
  CHECK(sluice::code_name(none) == "unknown");
  CHECK(sluice::wire::error_code_name(none) == "internal");
  CHECK(sluice::wire::parse_code("unknown") == Code::kInternal);
  CHECK(sluice::wire::parse_code("") == Code::kInternal);
}
