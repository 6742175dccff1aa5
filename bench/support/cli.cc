#include "support/cli.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

namespace sluice::bench {

Option::Option(std::string_view name, bool takes_value,
               std::function<bool(const std::string&)> reader)
    : name_(name), takes_value_(takes_value), read_(std::move(reader)) {}

Option::Option(std::string_view name, std::string* out)
    : Option(name, true, [out](const std::string& v) {
        *out = v;
        return true;
      }) {}

Option::Option(std::string_view name, double* out)
    : Option(name, true, [out](const std::string& v) {
        *out = std::atof(v.c_str());
        return true;
      }) {}

Option::Option(std::string_view name, int* out)
    : Option(name, true, [out](const std::string& v) {
        *out = std::atoi(v.c_str());
        return true;
      }) {}

Option::Option(std::string_view name, std::uint64_t* out)
    : Option(name, true, [out](const std::string& v) {
        *out = std::strtoull(v.c_str(), nullptr, 10);
        return true;
      }) {}

Option::Option(std::string_view name, bool* out, bool value)
    : Option(name, false, [out, value](const std::string&) {
        *out = value;
        return true;
      }) {}

Option Option::flag(std::string_view name, std::function<void()> action) {
  return Option(name, false, [action = std::move(action)](const std::string&) {
    action();
    return true;
  });
}

Option Option::with_value(std::string_view name, std::function<bool(const std::string&)> reader) {
  return Option(name, true, std::move(reader));
}

ParseResult parse_options(std::span<const Option> options, int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    const std::string arg = argv[i];
    const Option* option = nullptr;
    for (const Option& o : options) {
      if (o.name() == arg) {
        option = &o;
        break;
      }
    }
    if (option == nullptr) return {ParseResult::Error::kUnknown, arg, {}};
    std::string value;
    if (option->takes_value()) {
      if (i + 1 >= argc) return {ParseResult::Error::kMissingValue, arg, {}};
      value = argv[++i];
    }
    if (!option->read(value)) return {ParseResult::Error::kBadValue, arg, value};
  }
  return {};
}

std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> items;
  for (std::size_t from = 0;;) {
    const std::size_t comma = text.find(',', from);
    items.emplace_back(text.substr(from, comma == std::string_view::npos ? comma : comma - from));
    if (comma == std::string_view::npos) return items;
    from = comma + 1;
  }
}

void print_parse_error(const ParseResult& r, std::string_view unknown_hint) {
  switch (r.error) {
    case ParseResult::Error::kNone:
    case ParseResult::Error::kBadValue:
      return;
    case ParseResult::Error::kMissingValue:
      std::fprintf(stderr, "%s needs a value\n", r.option.c_str());
      return;
    case ParseResult::Error::kUnknown:
      std::fprintf(stderr, "unknown argument %s%.*s\n", r.option.c_str(),
                   static_cast<int>(unknown_hint.size()), unknown_hint.data());
      return;
  }
}

void exit_with_usage(int code, std::string_view text) {
  std::FILE* out = code == 0 ? stdout : stderr;
  std::fwrite(text.data(), 1, text.size(), out);
  std::exit(code);
}

void parse_options_or_exit(std::span<const Option> options, int argc, char** argv,
                           std::string_view usage, int first) {
  const ParseResult r = parse_options(options, argc, argv, first);
  if (r.ok()) return;
  print_parse_error(r);
  exit_with_usage(2, usage);
}

}  // namespace sluice::bench
