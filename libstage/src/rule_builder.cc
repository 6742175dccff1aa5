// Rules batches built from C++ values; see sluice/rule_builder.h.
#include "sluice/rule_builder.h"

#include <cmath>
#include <utility>

#include "rules.h"

namespace sluice {

using nlohmann::json;

ObjectConfig& ObjectConfig::set(const std::string& field, double value) {
  if (!std::isfinite(value) && error_.is_ok()) {
    error_ = Status::invalid(field + ": must be a finite number, got " + std::to_string(value));
  }
  return put(field, json(value));
}

ObjectConfig& ObjectConfig::put(const std::string& field, json value) {
  fields_[field] = std::move(value);
  return *this;
}

Match& Match::add(Classifier c, const json& values) {
  json& accepted = source_[std::string(classifier_name(c))];
  if (!accepted.is_array()) accepted = json::array();
  accepted.insert(accepted.end(), values.begin(), values.end());
  return *this;
}

Match& Match::origins(const std::vector<std::string>& names) {
  return add(Classifier::kOrigin, names);
}

Match& Match::operations(const std::vector<Op>& ops) {
  json names = json::array();
  for (Op op : ops) names.push_back(std::string(op_name(op)));
  return add(Classifier::kOperation, names);
}

Match& Match::tenants(const std::vector<std::uint32_t>& tenants) {
  return add(Classifier::kTenant, tenants);
}

Match& Match::workflows(const std::vector<std::uint64_t>& workflows) {
  return add(Classifier::kWorkflow, workflows);
}

Match& Match::size_classes(const std::vector<std::uint32_t>& size_classes) {
  return add(Classifier::kSizeClass, size_classes);
}

Match& Match::levels(const std::vector<std::uint32_t>& levels) {
  return add(Classifier::kLevel, levels);
}

namespace {

json classifier_list(const std::vector<Classifier>& classifiers) {
  json list = json::array();
  for (Classifier c : classifiers) list.push_back(std::string(classifier_name(c)));
  return list;
}

}  // namespace

RulesBuilder& RulesBuilder::add(json rule, const ObjectConfig* config) {
  if (config != nullptr) {
    if (!config->error().is_ok() && error_.is_ok()) {
      error_ = config->error().with_prefix("rules[" + std::to_string(rules_.size()) + "].config.");
    }
    rule["config"] = config->fields();
  }
  rules_.push_back(std::move(rule));
  return *this;
}

RulesBuilder& RulesBuilder::differentiate(const std::vector<Classifier>& classifiers,
                                          const std::string& channel) {
  json rule = {{"rule", "differentiate"}, {"classifiers", classifier_list(classifiers)}};
  if (!channel.empty()) rule["channel"] = channel;
  return add(std::move(rule));
}

RulesBuilder& RulesBuilder::create_channel(const std::string& channel,
                                           const ChannelOptions& options) {
  json rule = {{"rule", "create_channel"}, {"channel", channel}};
  if (!options.match.empty()) rule["match"] = options.match.source();
  if (options.is_default) rule["default"] = true;
  if (!options.classifiers.empty()) rule["classifiers"] = classifier_list(options.classifiers);
  return add(std::move(rule));
}

RulesBuilder& RulesBuilder::remove_channel(const std::string& channel) {
  return add({{"rule", "remove_channel"}, {"channel", channel}});
}

RulesBuilder& RulesBuilder::create_object(const std::string& channel, const std::string& object,
                                          const std::string& type,
                                          const std::optional<ObjectConfig>& config,
                                          const ObjectOptions& options) {
  json rule = {{"rule", "create_object"}, {"channel", channel}, {"object", object}, {"type", type}};
  if (!options.match.empty()) rule["match"] = options.match.source();
  if (options.is_default) rule["default"] = true;
  return add(std::move(rule), config ? &*config : nullptr);
}

RulesBuilder& RulesBuilder::remove_object(const std::string& channel, const std::string& object) {
  return add({{"rule", "remove_object"}, {"channel", channel}, {"object", object}});
}

RulesBuilder& RulesBuilder::route(const std::string& channel, const Match& match,
                                  const std::string& object) {
  json rule = {{"rule", "route"}, {"channel", channel}, {"match", match.source()}};
  if (!object.empty()) rule["object"] = object;
  return add(std::move(rule));
}

RulesBuilder& RulesBuilder::configure(const std::string& channel, const std::string& object,
                                      const ObjectConfig& config) {
  return add({{"rule", "configure"}, {"channel", channel}, {"object", object}}, &config);
}

RulesBuilder& RulesBuilder::add_json(json rule) {
  return add(std::move(rule));
}

StatusOr<json> RulesBuilder::build() const {
  if (!error_.is_ok()) return error_;
  json batch = {{"version", 1}, {"rules", rules_}};
  SLUICE_RETURN_IF_ERROR(detail::parse_rules(batch).status());
  return batch;
}

}  // namespace sluice
