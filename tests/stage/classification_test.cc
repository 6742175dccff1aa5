// Channel and object selection checked against an independent reference:
// random stage layouts, thousands of random contexts, and a linear-scan model
// of docs/rules.md's routing semantics.
#include <catch2/catch.hpp>

#include <map>
#include <optional>
#include <random>
#include <vector>

#include "probe.h"
#include "sluice/stage.h"

using namespace sluice;
using nlohmann::json;

namespace {

// Small domains so that random contexts hit the matches often.
const std::vector<std::string> kOrigins = {"foreground", "flush", "compaction_L0_L1", "wal",
                                           "tenant-x"};
const std::vector<Op> kOps = {Op::kRead, Op::kWrite, Op::kSync, Op::kOpen};

struct RefMatch {
  std::map<Classifier, std::vector<std::uint64_t>> values;
  bool accepts(const Context& c) const {
    for (const auto& [cl, vals] : values) {
      std::uint64_t v = 0;
      switch (cl) {
        case Classifier::kWorkflow:
          v = c.workflow;
          break;
        case Classifier::kOperation:
          v = static_cast<std::uint64_t>(c.op);
          break;
        case Classifier::kSizeClass:
          v = size_class_of(c.size);
          break;
        case Classifier::kOrigin:
          v = c.origin;
          break;
        case Classifier::kTenant:
          v = c.tenant;
          break;
        case Classifier::kLevel:
          v = c.level;
          break;
      }
      if (std::find(vals.begin(), vals.end(), v) == vals.end()) return false;
    }
    return true;
  }
};

struct RefObject {
  int id;
  std::optional<RefMatch> match;
  bool is_default;
};
struct RefChannel {
  std::optional<RefMatch> match;
  bool is_default;
  std::vector<RefObject> objects;
};

json value_json(Classifier c, std::uint64_t v) {
  if (c == Classifier::kOperation) return std::string(op_name(static_cast<Op>(v)));
  if (c == Classifier::kOrigin) return std::string(origin_name(static_cast<OriginId>(v)));
  return v;
}

std::vector<std::uint64_t> domain(Classifier c) {
  switch (c) {
    case Classifier::kWorkflow:
      return {1, 2, 3, 4};
    case Classifier::kOperation: {
      std::vector<std::uint64_t> d;
      for (Op op : kOps) d.push_back(static_cast<std::uint64_t>(op));
      return d;
    }
    case Classifier::kSizeClass:
      return {0, 1, 13, 18};
    case Classifier::kOrigin: {
      std::vector<std::uint64_t> d;
      for (const auto& o : kOrigins) d.push_back(*intern_origin(o));
      return d;
    }
    case Classifier::kTenant:
      return {0, 7, 8};
    case Classifier::kLevel:
      return {0, 1, 2};
  }
  return {};
}

std::uint64_t size_of_class(std::uint64_t cls) {
  return cls == 0 ? 0 : (std::uint64_t{1} << (cls - 1));
}

// A random match over exactly `set`; values are single or arrays.
std::pair<RefMatch, json> random_match(std::mt19937_64& rng, const std::vector<Classifier>& set) {
  RefMatch m;
  json j = json::object();
  for (Classifier c : set) {
    auto d = domain(c);
    std::shuffle(d.begin(), d.end(), rng);
    std::size_t n = 1 + rng() % 2;
    std::vector<std::uint64_t> vals(d.begin(), d.begin() + static_cast<long>(n));
    m.values[c] = vals;
    std::string key(classifier_name(c));
    if (n == 1 && rng() % 2) {
      j[key] = value_json(c, vals[0]);
    } else {
      j[key] = json::array();
      for (auto v : vals) j[key].push_back(value_json(c, v));
    }
  }
  return {m, j};
}

std::vector<Classifier> random_set(std::mt19937_64& rng) {
  std::vector<Classifier> s;
  for (int i = 0; i < kClassifierCount; ++i) {
    if (rng() % 3 == 0) s.push_back(static_cast<Classifier>(i));
  }
  return s;
}

json names(const std::vector<Classifier>& set) {
  json a = json::array();
  for (Classifier c : set) a.push_back(std::string(classifier_name(c)));
  return a;
}

bool overlaps(const RefMatch& a, const RefMatch& b) {
  for (const auto& [c, va] : a.values) {
    const auto& vb = b.values.at(c);
    bool common = false;
    for (auto v : va) common |= std::find(vb.begin(), vb.end(), v) != vb.end();
    if (!common) return false;
  }
  return true;
}

Context random_context(std::mt19937_64& rng) {
  Context c;
  auto pick = [&](Classifier cl) {
    auto d = domain(cl);
    return d[rng() % d.size()];
  };
  c.workflow = pick(Classifier::kWorkflow);
  c.op = static_cast<Op>(pick(Classifier::kOperation));
  std::uint64_t cls = pick(Classifier::kSizeClass);
  c.size = size_of_class(cls);
  if (cls >= 2) c.size += rng() % size_of_class(cls);  // anywhere in [2^(cls-1), 2^cls)
  c.origin = static_cast<OriginId>(pick(Classifier::kOrigin));
  c.tenant = static_cast<std::uint32_t>(pick(Classifier::kTenant));
  c.level = static_cast<std::uint8_t>(pick(Classifier::kLevel));
  return c;
}

}  // namespace

TEST_CASE("channel and object selection agree with a reference model on random layouts") {
  std::mt19937_64 rng(20261121);
  int layouts = 0;
  int checked = 0;
  int routed_to_objects = 0;
  while (layouts < 60) {
    auto stage_set = random_set(rng);
    json rules = json::array();
    rules.push_back({{"rule", "differentiate"}, {"classifiers", names(stage_set)}});
    std::vector<RefChannel> ref;
    int next_id = 1;
    int nch = 1 + static_cast<int>(rng() % 5);
    bool have_default_channel = false;
    std::vector<RefMatch> channel_matches;
    for (int ci = 0; ci < nch; ++ci) {
      RefChannel ch;
      std::string cname = "c" + std::to_string(ci);
      json create = {{"rule", "create_channel"}, {"channel", cname}};
      if (rng() % 4 != 0) {
        auto [m, j] = random_match(rng, stage_set);
        bool clash = false;
        for (const auto& other : channel_matches) clash |= overlaps(m, other);
        if (!clash) {
          ch.match = m;
          channel_matches.push_back(m);
          create["match"] = j;
        }
      }
      ch.is_default = !have_default_channel && rng() % 4 == 0;
      have_default_channel |= ch.is_default;
      if (ch.is_default) create["default"] = true;
      rules.push_back(create);
      auto obj_set = random_set(rng);
      rules.push_back(
          {{"rule", "differentiate"}, {"channel", cname}, {"classifiers", names(obj_set)}});
      int nobj = static_cast<int>(rng() % 4);
      bool have_default_object = false;
      std::vector<RefMatch> object_matches;
      for (int oi = 0; oi < nobj; ++oi) {
        RefObject o{next_id++, std::nullopt, false};
        json co = {{"rule", "create_object"},
                   {"channel", cname},
                   {"object", "o" + std::to_string(oi)},
                   {"type", "probe"},
                   {"config", {{"id", o.id}}}};
        if (rng() % 3 != 0) {
          auto [m, j] = random_match(rng, obj_set);
          bool clash = false;
          for (const auto& other : object_matches) clash |= overlaps(m, other);
          if (!clash) {
            o.match = m;
            object_matches.push_back(m);
            co["match"] = j;
          }
        }
        o.is_default = !have_default_object && rng() % 4 == 0;
        have_default_object |= o.is_default;
        if (o.is_default) co["default"] = true;
        rules.push_back(co);
        ch.objects.push_back(o);
      }
      ref.push_back(ch);
    }
    StageOptions opts;
    opts.registry = &test::probe_registry();
    auto stage = Stage::create(opts);
    REQUIRE(stage.is_ok());
    Status st = stage.value()->apply(rules);
    INFO(rules.dump());
    REQUIRE(st.to_string() == "ok");
    ++layouts;

    for (int i = 0; i < 200; ++i) {
      Context c = random_context(rng);
      // Reference: the channel whose match accepts, else the default channel.
      const RefChannel* ch = nullptr;
      for (const auto& rc : ref) {
        if (rc.match && rc.match->accepts(c)) ch = &rc;
      }
      if (ch == nullptr) {
        for (const auto& rc : ref) {
          if (rc.is_default) ch = &rc;
        }
      }
      int expected = 0;
      if (ch != nullptr && !ch->objects.empty()) {
        const RefObject* o = nullptr;
        for (const auto& ro : ch->objects) {
          if (ro.match && ro.match->accepts(c)) o = &ro;
        }
        if (o == nullptr) {
          for (const auto& ro : ch->objects) {
            if (ro.is_default) o = &ro;
          }
        }
        if (o == nullptr) o = &ch->objects.front();
        expected = o->id;
      }
      test::last_probe = 0;
      stage.value()->enforce(c);
      INFO("context: workflow=" << c.workflow << " op=" << op_name(c.op) << " size=" << c.size
                                << " origin=" << origin_name(c.origin) << " tenant=" << c.tenant
                                << " level=" << int(c.level));
      REQUIRE(test::last_probe == expected);
      routed_to_objects += expected != 0;
      ++checked;
    }
  }
  CHECK(checked == 60 * 200);
  CHECK(routed_to_objects > checked / 4);  // the layouts really exercised routing
}

TEST_CASE("the per-thread memo never serves a decision across a rule change") {
  StageOptions opts;
  opts.registry = &test::probe_registry();
  auto stage = Stage::create(opts).value();
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "differentiate", "classifiers": ["origin"]},
    {"rule": "create_channel", "channel": "a", "match": {"origin": "flush"}},
    {"rule": "create_object", "channel": "a", "object": "x", "type": "probe", "config": {"id": 1}}
  ])"))
              .is_ok());
  Context c = make_context(Op::kWrite, 4096);
  c.origin = origin::kFlush;
  stage->enforce(c);
  CHECK(test::last_probe == 1);
  REQUIRE(stage
              ->apply(json::parse(R"([
    {"rule": "remove_object", "channel": "a", "object": "x"},
    {"rule": "create_object", "channel": "a", "object": "y", "type": "probe", "config": {"id": 2}}
  ])"))
              .is_ok());
  stage->enforce(c);
  CHECK(test::last_probe == 2);
  REQUIRE(stage->apply(json::parse(R"([{"rule": "remove_channel", "channel": "a"}])")).is_ok());
  test::last_probe = 0;
  stage->enforce(c);
  CHECK(test::last_probe == 0);
  auto stats = stage->collect();
  CHECK(stats.unclassified.ops == 1);
  // The removed channel's counts are collected under its name, not lost.
  CHECK(stats.total.ops == 3);
  REQUIRE(stats.channel("a") != nullptr);
  CHECK(stats.channel("a")->total.ops == 2);
}

TEST_CASE("several stages in one thread keep separate routing") {
  StageOptions opts;
  opts.registry = &test::probe_registry();
  std::vector<std::unique_ptr<Stage>> stages;
  for (int i = 0; i < 6; ++i) {  // more stages than the per-thread cache holds
    stages.push_back(Stage::create(opts).value());
    json rules = json::array({{{"rule", "create_channel"}, {"channel", "c"}, {"default", true}},
                              {{"rule", "create_object"},
                               {"channel", "c"},
                               {"object", "o"},
                               {"type", "probe"},
                               {"config", {{"id", 100 + i}}}}});
    REQUIRE(stages.back()->apply(rules).is_ok());
  }
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 6; ++i) {
      stages[static_cast<std::size_t>(i)]->enforce(Op::kRead, 10);
      CHECK(test::last_probe == 100 + i);
    }
  }
}
