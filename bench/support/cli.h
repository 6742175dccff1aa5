// Command-line options of the benchmark and example programs: a table of
// option names and where each one's value goes, read by one parser, so that
// every program reads its arguments the same way.
//
// A program lists its options (Option), calls parse_options() and decides what
// to print and which exit code to return for each kind of error it reports;
// exit_with_usage() prints its usage text.
//
// Thread safety: parse_options() writes through the table's pointers and calls
// its functions on the calling thread; a table belongs to one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace sluice::bench {

// One option: its name ("--db"), whether a value follows it, and what reading
// it does. The option keeps a view of its name: a string literal, or a string
// that outlives it.
class Option {
 public:
  // An option with a value, stored in *out: a string as given, a double read
  // with std::atof, an int with std::atoi, an unsigned 64-bit number with
  // std::strtoull (base 10). None refuses a value (atof("x") is 0).
  Option(std::string_view name, std::string* out);
  Option(std::string_view name, double* out);
  Option(std::string_view name, int* out);
  Option(std::string_view name, std::uint64_t* out);
  // An option with a value, stored in *out as `reader` makes it of the text
  // (which may refuse it by throwing, as std::stoi does).
  template <typename T, typename Read,
            typename = std::enable_if_t<std::is_invocable_r_v<T, Read, const std::string&>>>
  Option(std::string_view name, T* out, Read reader)
      : Option(name, true, [out, reader](const std::string& v) {
          *out = reader(v);
          return true;
        }) {}
  // A flag (no value) that sets *out to `value`.
  Option(std::string_view name, bool* out, bool value);

  // A flag (no value) that runs `action`.
  static Option flag(std::string_view name, std::function<void()> action);
  // An option whose value `reader` checks and stores; `reader` returns false for a
  // value it refuses.
  static Option with_value(std::string_view name, std::function<bool(const std::string&)> reader);

  std::string_view name() const { return name_; }
  bool takes_value() const { return takes_value_; }
  // Applies the option; `value` is "" for a flag. False: the value is refused.
  bool read(const std::string& value) const { return read_(value); }

 private:
  Option(std::string_view name, bool takes_value, std::function<bool(const std::string&)> reader);
  std::string_view name_;
  bool takes_value_;
  std::function<bool(const std::string&)> read_;
};

struct ParseResult {
  enum class Error {
    kNone,
    kUnknown,       // `option` is not in the table
    kMissingValue,  // `option` takes a value and is the last argument
    kBadValue,      // `option`'s reader refused `value`
  };
  Error error = Error::kNone;
  std::string option;  // the argument at fault
  std::string value;   // its value, for kBadValue
  bool ok() const { return error == Error::kNone; }
};

// Reads argv[first], argv[first + 1], ... against `options`, in order, and
// stops at the first argument it cannot read (the options before it are
// applied). An option given twice is applied twice (the last value stays).
ParseResult parse_options(std::span<const Option> options, int argc, char** argv, int first = 1);

// The items of a comma-separated list, empty ones included: "a,,b" is
// {"a", "", "b"} and "" is {""}.
std::vector<std::string> split_list(std::string_view text);

// Says on stderr what went wrong, in the words the programs share: "<option>
// needs a value", "unknown argument <option><unknown_hint>". A refused value
// gets no line here: its reader says why (it knows what it expects).
void print_parse_error(const ParseResult& r, std::string_view unknown_hint = "");

// parse_options() for a program that stops at a bad argument: on error says
// what went wrong (print_parse_error) and exits with code 2 after printing
// `usage` (exit_with_usage).
void parse_options_or_exit(std::span<const Option> options, int argc, char** argv,
                           std::string_view usage, int first = 1);

// Prints a program's usage text and exits with `code`: the text goes to
// stdout when the user asked for it (code 0), else to stderr.
[[noreturn]] void exit_with_usage(int code, std::string_view text);

}  // namespace sluice::bench
