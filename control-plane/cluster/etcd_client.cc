// etcd's v3 JSON gateway over HTTP/1.1 (Boost.Beast on a private Asio
// io_context per call): requests, failover across endpoints, and the
// translation of etcd's JSON to and from the client's types (etcd_client.h).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wnull-dereference"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wtsan"
#endif

#include "etcd_client.h"

#include "sluice/json_text.h"

#include <array>
#include <charconv>
#include <string_view>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

namespace sluice::cluster {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------
// Base64.

namespace {
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int b64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}
}  // namespace

std::string base64_encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  for (; i + 2 < bytes.size(); i += 3) {
    const unsigned v = (p[i] << 16) | (p[i + 1] << 8) | p[i + 2];
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i + 1 == bytes.size()) {
    const unsigned v = p[i] << 16;
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == bytes.size()) {
    const unsigned v = (p[i] << 16) | (p[i + 1] << 8);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

std::optional<std::string> base64_decode(const std::string& text) {
  if (text.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text[i + static_cast<std::size_t>(k)];
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        v[k] = 0;
        ++pad;
      } else if (pad > 0 || (v[k] = b64_value(c)) < 0) {
        return std::nullopt;
      }
    }
    const unsigned n = (static_cast<unsigned>(v[0]) << 18) | (static_cast<unsigned>(v[1]) << 12) |
                       (static_cast<unsigned>(v[2]) << 6) | static_cast<unsigned>(v[3]);
    out += static_cast<char>((n >> 16) & 255);
    if (pad < 2) out += static_cast<char>((n >> 8) & 255);
    if (pad < 1) out += static_cast<char>(n & 255);
  }
  return out;
}

// ---------------------------------------------------------------------------
// JSON helpers.

namespace {

// An int64 field (a string on the wire; a number accepted too); 0 when absent.
std::int64_t i64(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (!it->is_string()) return 0;
  const std::string& s = it->get_ref<const std::string&>();
  std::int64_t v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v);
  return v;
}

std::string bytes_field(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return {};
  return base64_decode(it->get<std::string>()).value_or(std::string{});
}

KeyValue kv_of(const json& j) {
  KeyValue kv;
  kv.key = bytes_field(j, "key");
  kv.value = bytes_field(j, "value");
  kv.create_revision = i64(j, "create_revision");
  kv.mod_revision = i64(j, "mod_revision");
  kv.version = i64(j, "version");
  kv.lease = i64(j, "lease");
  return kv;
}

RangeResult range_of(const json& j) {
  RangeResult r;
  if (auto h = j.find("header"); h != j.end() && h->is_object()) r.revision = i64(*h, "revision");
  if (auto kvs = j.find("kvs"); kvs != j.end() && kvs->is_array()) {
    for (const json& k : *kvs) r.kvs.push_back(kv_of(k));
  }
  return r;
}

json range_request(const std::string& key, const std::string& range_end, std::int64_t rev) {
  json req{{"key", base64_encode(key)}};
  if (!range_end.empty()) req["range_end"] = base64_encode(range_end);
  if (rev > 0) req["revision"] = std::to_string(rev);
  return req;
}

json op_json(const TxnOp& op) {
  switch (op.kind) {
    case TxnOp::Kind::kPut: {
      json p{{"key", base64_encode(op.key)}, {"value", base64_encode(op.value)}};
      if (op.lease != 0) p["lease"] = std::to_string(op.lease);
      return {{"request_put", p}};
    }
    case TxnOp::Kind::kDelete: {
      json d{{"key", base64_encode(op.key)}};
      if (!op.range_end.empty()) d["range_end"] = base64_encode(op.range_end);
      return {{"request_delete_range", d}};
    }
    case TxnOp::Kind::kRange:
      return {{"request_range", range_request(op.key, op.range_end, 0)}};
  }
  return json::object();
}

json compare_json(const Compare& c) {
  static constexpr std::array<const char*, 4> kTargets{"CREATE", "MOD", "VERSION", "VALUE"};
  static constexpr std::array<const char*, 4> kResults{"EQUAL", "NOT_EQUAL", "GREATER", "LESS"};
  json j{{"key", base64_encode(c.key)},
         {"target", kTargets[static_cast<std::size_t>(c.target)]},
         {"result", kResults[static_cast<std::size_t>(c.result)]}};
  switch (c.target) {
    case Compare::Target::kCreate:
      j["create_revision"] = std::to_string(c.number);
      break;
    case Compare::Target::kMod:
      j["mod_revision"] = std::to_string(c.number);
      break;
    case Compare::Target::kVersion:
      j["version"] = std::to_string(c.number);
      break;
    case Compare::Target::kValue:
      j["value"] = base64_encode(c.value);
      break;
  }
  return j;
}

json leader_json(const LeaderKey& l) {
  return {{"name", base64_encode(l.name)},
          {"key", base64_encode(l.key)},
          {"rev", std::to_string(l.rev)},
          {"lease", std::to_string(l.lease)}};
}

// etcd's error (grpc-gateway: {"error", "message", "code"}) as a Status.
Status etcd_error(const std::string& where, const json& body, unsigned http_status) {
  std::string msg = "HTTP " + std::to_string(http_status);
  int code = -1;
  if (body.is_object()) {
    if (auto m = body.find("message"); m != body.end() && m->is_string())
      msg = m->get<std::string>();
    if (auto c = body.find("code"); c != body.end() && c->is_number_integer()) code = c->get<int>();
  }
  const std::string text = where + ": " + msg;
  if (msg.find("lease not found") != std::string::npos) return Status::precondition(text);
  switch (code) {
    case 3:
      return Status::invalid(text);
    case 5:
      return Status::not_found(text);
    case 9:
    case 11:
      return Status::precondition(text);
    case 4:
    case 14:
      return Status::unavailable(text);
    default:
      return Status::io_error(text);
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// One HTTP exchange.

// A POST to one endpoint. `transport` tells a failure to reach the endpoint
// (worth another endpoint) from an answer.
struct EtcdCall {
  struct Outcome {
    Status status;           // ok: http_status and body are set
    bool transport = false;  // the endpoint could not be reached or did not answer in time
    unsigned http_status = 0;
    std::string body;
  };

  // Runs `ioc` until *done or the deadline, or *stop; then closes `sock`
  // and drains. False when it had to stop the operation.
  static bool run_until(asio::io_context& ioc, tcp::socket& sock, const bool& done,
                        SteadyClock::time_point deadline, const std::atomic<bool>* stop) {
    while (!done) {
      const auto now = SteadyClock::now();
      if (now >= deadline || (stop != nullptr && stop->load(std::memory_order_relaxed))) {
        boost::system::error_code ignored;
        sock.close(ignored);
        ioc.restart();
        ioc.run();
        return false;
      }
      ioc.restart();
      ioc.run_for(std::min<SteadyClock::duration>(deadline - now, std::chrono::milliseconds(100)));
    }
    return true;
  }

  // on_line: for a streaming answer (watch), each line of a 200 answer as it
  // comes; returning false ends the exchange. Null: the body is returned.
  static Outcome post(const EtcdClient::Endpoint& ep, const std::string& target,
                      const std::string& body, SteadyClock::time_point deadline,
                      const std::atomic<bool>* stop,
                      const std::function<bool(std::string_view)>* on_line) {
    Outcome out;
    asio::io_context ioc;
    tcp::socket sock(ioc);
    boost::system::error_code ec;
    bool done = false;
    auto fail = [&](std::string what, bool timed_out) {
      out.transport = true;
      out.status =
          Status::unavailable(timed_out ? what + ": timed out" : what + ": " + ec.message());
      return out;
    };
    tcp::resolver resolver(ioc);
    auto addrs = resolver.resolve(ep.host, ep.port, ec);
    if (ec) return fail("resolve", false);
    asio::async_connect(sock, addrs, [&](boost::system::error_code e, const tcp::endpoint&) {
      ec = e;
      done = true;
    });
    if (!run_until(ioc, sock, done, deadline, stop)) return fail("connect", true);
    if (ec) return fail("connect", false);

    http::request<http::string_body> req{http::verb::post, target, 11};
    req.set(http::field::host, ep.host + ":" + ep.port);
    req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    done = false;
    http::async_write(sock, req, [&](boost::system::error_code e, std::size_t) {
      ec = e;
      done = true;
    });
    if (!run_until(ioc, sock, done, deadline, stop)) return fail("send", true);
    if (ec) return fail("send", false);

    beast::flat_buffer buf;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64u << 20);
    done = false;
    http::async_read_header(sock, buf, parser, [&](boost::system::error_code e, std::size_t) {
      ec = e;
      done = true;
    });
    if (!run_until(ioc, sock, done, deadline, stop)) return fail("receive", true);
    if (ec) return fail("receive", false);
    out.http_status = parser.get().result_int();

    if (on_line != nullptr && out.http_status == 200) {
      std::string pending;
      bool more = true;
      auto take = [&](std::string_view piece) {
        pending.append(piece);
        std::size_t pos;
        while (more && (pos = pending.find('\n')) != std::string::npos) {
          more = (*on_line)(std::string_view(pending).substr(0, pos));
          pending.erase(0, pos + 1);
        }
      };
      auto chunk = [&](std::uint64_t, beast::string_view piece,
                       boost::system::error_code&) -> std::size_t {
        take(std::string_view(piece.data(), piece.size()));
        return piece.size();
      };
      parser.on_chunk_body(chunk);
      while (more && !parser.is_done()) {
        done = false;
        http::async_read_some(sock, buf, parser, [&](boost::system::error_code e, std::size_t) {
          ec = e;
          done = true;
        });
        if (!run_until(ioc, sock, done, deadline, stop)) break;  // the watch's time is up
        if (ec) return fail("receive", false);
      }
      if (!pending.empty() && more) (*on_line)(pending);
      boost::system::error_code ignored;
      sock.close(ignored);
      return out;
    }
    done = false;
    http::async_read(sock, buf, parser, [&](boost::system::error_code e, std::size_t) {
      ec = e;
      done = true;
    });
    if (!run_until(ioc, sock, done, deadline, stop)) return fail("receive", true);
    if (ec) return fail("receive", false);
    out.body = std::move(parser.get().body());
    return out;
  }
};

// ---------------------------------------------------------------------------
// The client.

namespace {

StatusOr<EtcdClient::Endpoint> parse_endpoint(const std::string& url) {
  std::string_view s = url;
  if (s.rfind("http://", 0) == 0) s.remove_prefix(7);
  if (url.rfind("https://", 0) == 0) {
    return Status::invalid("etcd endpoint '" + url + "': https is not supported");
  }
  while (!s.empty() && s.back() == '/') s.remove_suffix(1);
  const auto colon = s.rfind(':');
  if (s.empty() || colon == std::string_view::npos || colon == 0 || colon + 1 == s.size() ||
      s.find('/') != std::string_view::npos) {
    return Status::invalid("etcd endpoint '" + url + "': expected http://HOST:PORT");
  }
  EtcdClient::Endpoint ep{std::string(s.substr(0, colon)), std::string(s.substr(colon + 1))};
  int port = 0;
  auto [p, err] = std::from_chars(ep.port.data(), ep.port.data() + ep.port.size(), port);
  if (err != std::errc() || p != ep.port.data() + ep.port.size() || port < 1 || port > 65535) {
    return Status::invalid("etcd endpoint '" + url + "': port must be 1..65535");
  }
  return ep;
}

// One call with failover: the preferred endpoint first, then the others.
struct Caller {
  const EtcdClient& c;
  const std::vector<EtcdClient::Endpoint>& eps;
  std::atomic<std::size_t>& preferred;
  const std::vector<std::string>& names;

  StatusOr<json> call(const char* what, const json& body, std::chrono::milliseconds timeout,
                      const std::atomic<bool>* stop = nullptr,
                      const std::function<bool(std::string_view)>* on_line = nullptr) const {
    const std::string text = body.dump();
    const std::string target = std::string("/v3/") + what;
    std::string tried;
    const std::size_t first = preferred.load(std::memory_order_relaxed);
    for (std::size_t k = 0; k < eps.size(); ++k) {
      const std::size_t i = (first + k) % eps.size();
      const auto deadline = SteadyClock::now() + timeout;
      EtcdCall::Outcome o = EtcdCall::post(eps[i], target, text, deadline, stop, on_line);
      if (o.transport) {
        tried += (tried.empty() ? "" : "; ") + names[i] + ": " + o.status.message();
        if (stop != nullptr && stop->load()) break;
        continue;
      }
      preferred.store(i, std::memory_order_relaxed);
      const std::string where = "etcd " + names[i] + " " + what;
      if (on_line != nullptr && o.http_status == 200) return json::object();
      json j = json_depth_within(o.body) ? json::parse(o.body, nullptr, false)
                                         : json(json::value_t::discarded);
      if (o.http_status != 200 || j.is_discarded() || !j.is_object() || j.contains("error")) {
        if (o.http_status == 200 && j.is_discarded()) {
          return Status::io_error(where + ": answer is not JSON");
        }
        return etcd_error(where, j, o.http_status);
      }
      return j;
    }
    return Status::unavailable(std::string("etcd ") + what + ": no endpoint answered (" + tried +
                               ")");
  }
};

}  // namespace

EtcdClient::EtcdClient(EtcdOptions options, std::vector<Endpoint> parsed)
    : opt_(std::move(options)), endpoints_(opt_.endpoints), parsed_(std::move(parsed)) {}
EtcdClient::~EtcdClient() = default;

StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::create(EtcdOptions options) {
  if (options.endpoints.empty()) return Status::invalid("etcd endpoints: at least one is needed");
  if (options.timeout.count() < 1) return Status::invalid("etcd timeout: must be >= 1 ms");
  std::vector<Endpoint> parsed;
  for (const std::string& e : options.endpoints) {
    auto ep = parse_endpoint(e);
    if (!ep) return ep.status();
    parsed.push_back(std::move(*ep));
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(options), std::move(parsed)));
}

std::string EtcdClient::prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(end.back());
    if (c < 0xff) {
      ++c;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

#define SLUICE_ETCD_CALLER                 \
  Caller {                                 \
    *this, parsed_, preferred_, endpoints_ \
  }

StatusOr<RangeResult> EtcdClient::range(const std::string& key, const std::string& range_end,
                                        std::int64_t revision) const {
  auto j =
      SLUICE_ETCD_CALLER.call("kv/range", range_request(key, range_end, revision), opt_.timeout);
  if (!j) return j.status();
  return range_of(*j);
}

StatusOr<std::int64_t> EtcdClient::put(const std::string& key, const std::string& value,
                                       std::int64_t lease) const {
  json req{{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) req["lease"] = std::to_string(lease);
  auto j = SLUICE_ETCD_CALLER.call("kv/put", req, opt_.timeout);
  if (!j) return j.status();
  return i64(j->value("header", json::object()), "revision");
}

StatusOr<std::int64_t> EtcdClient::delete_range(const std::string& key,
                                                const std::string& range_end) const {
  json req{{"key", base64_encode(key)}};
  if (!range_end.empty()) req["range_end"] = base64_encode(range_end);
  auto j = SLUICE_ETCD_CALLER.call("kv/deleterange", req, opt_.timeout);
  if (!j) return j.status();
  return i64(*j, "deleted");
}

StatusOr<TxnResult> EtcdClient::txn(const std::vector<Compare>& compares,
                                    const std::vector<TxnOp>& success,
                                    const std::vector<TxnOp>& failure) const {
  json req{{"compare", json::array()}, {"success", json::array()}, {"failure", json::array()}};
  for (const Compare& c : compares) req["compare"].push_back(compare_json(c));
  for (const TxnOp& op : success) req["success"].push_back(op_json(op));
  for (const TxnOp& op : failure) req["failure"].push_back(op_json(op));
  auto j = SLUICE_ETCD_CALLER.call("kv/txn", req, opt_.timeout);
  if (!j) return j.status();
  TxnResult r;
  r.succeeded = j->value("succeeded", false);
  r.revision = i64(j->value("header", json::object()), "revision");
  if (auto rs = j->find("responses"); rs != j->end() && rs->is_array()) {
    for (const json& one : *rs) {
      if (auto rr = one.find("response_range"); rr != one.end()) r.ranges.push_back(range_of(*rr));
    }
  }
  return r;
}

StatusOr<Lease> EtcdClient::lease_grant(std::int64_t ttl_s) const {
  if (ttl_s < 1) return Status::invalid("lease ttl: must be >= 1 s");
  auto j =
      SLUICE_ETCD_CALLER.call("lease/grant", json{{"TTL", std::to_string(ttl_s)}}, opt_.timeout);
  if (!j) return j.status();
  if (j->contains("error") || i64(*j, "ID") == 0) {
    return Status::io_error("etcd lease/grant: " +
                            j->value("error", std::string("no lease granted")));
  }
  return Lease{i64(*j, "ID"), i64(*j, "TTL")};
}

StatusOr<std::int64_t> EtcdClient::lease_keepalive(std::int64_t id) const {
  auto j =
      SLUICE_ETCD_CALLER.call("lease/keepalive", json{{"ID", std::to_string(id)}}, opt_.timeout);
  if (!j) return j.status();
  const json result = j->value("result", json::object());
  const std::int64_t ttl = i64(result, "TTL");
  if (ttl <= 0) {
    return Status::precondition("etcd lease/keepalive: lease " + std::to_string(id) +
                                " has expired or was revoked");
  }
  return ttl;
}

Status EtcdClient::lease_revoke(std::int64_t id) const {
  auto j = SLUICE_ETCD_CALLER.call("lease/revoke", json{{"ID", std::to_string(id)}}, opt_.timeout);
  return j.status();
}

StatusOr<LeaderKey> EtcdClient::campaign(const std::string& name, const std::string& value,
                                         std::int64_t lease, std::chrono::milliseconds wait,
                                         const std::atomic<bool>* stop) const {
  json req{{"name", base64_encode(name)},
           {"value", base64_encode(value)},
           {"lease", std::to_string(lease)}};
  auto j = SLUICE_ETCD_CALLER.call("election/campaign", req, wait, stop);
  if (!j) return j.status();
  const json l = j->value("leader", json::object());
  LeaderKey k{bytes_field(l, "name"), bytes_field(l, "key"), i64(l, "rev"), i64(l, "lease")};
  if (k.key.empty() || k.rev == 0) return Status::io_error("etcd election/campaign: no leader key");
  return k;
}

StatusOr<std::optional<KeyValue>> EtcdClient::leader(const std::string& name) const {
  auto j =
      SLUICE_ETCD_CALLER.call("election/leader", json{{"name", base64_encode(name)}}, opt_.timeout);
  if (!j) {
    if (j.status().message().find("election: no leader") != std::string::npos) {
      return std::optional<KeyValue>{};
    }
    return j.status();
  }
  auto kv = j->find("kv");
  if (kv == j->end() || !kv->is_object()) return std::optional<KeyValue>{};
  return std::optional<KeyValue>{kv_of(*kv)};
}

Status EtcdClient::proclaim(const LeaderKey& leader, const std::string& value) const {
  auto j = SLUICE_ETCD_CALLER.call(
      "election/proclaim", json{{"leader", leader_json(leader)}, {"value", base64_encode(value)}},
      opt_.timeout);
  return j.status();
}

Status EtcdClient::resign(const LeaderKey& leader) const {
  auto j = SLUICE_ETCD_CALLER.call("election/resign", json{{"leader", leader_json(leader)}},
                                   opt_.timeout);
  return j.status();
}

StatusOr<std::int64_t> EtcdClient::watch(
    const std::string& key, const std::string& range_end, std::int64_t start_revision,
    std::chrono::milliseconds wait, const std::atomic<bool>* stop,
    const std::function<void(const WatchEvent&)>& on_event) const {
  json create{{"key", base64_encode(key)}};
  if (!range_end.empty()) create["range_end"] = base64_encode(range_end);
  if (start_revision > 0) create["start_revision"] = std::to_string(start_revision);
  std::int64_t next = start_revision;
  Status failed;
  std::function<bool(std::string_view)> on_line = [&](std::string_view line) {
    json m = json_depth_within(line) ? json::parse(line, nullptr, false)
                                     : json(json::value_t::discarded);
    if (m.is_discarded() || !m.is_object()) return true;  // not a message: skipped
    if (m.contains("error")) {
      failed = etcd_error("etcd watch", m.value("error", json::object()), 200);
      return false;
    }
    const json r = m.value("result", json::object());
    if (i64(r, "compact_revision") > 0) {
      failed = Status::precondition(
          "etcd watch: revision " + std::to_string(start_revision) +
          " was compacted (oldest kept: " + std::to_string(i64(r, "compact_revision")) + ")");
      return false;
    }
    if (r.value("canceled", false)) {
      failed = Status::io_error("etcd watch: canceled: " + r.value("cancel_reason", std::string()));
      return false;
    }
    if (next == 0) {  // from now: what follows the revision the watch was created at
      next = i64(r.value("header", json::object()), "revision") + 1;
    }
    if (auto evs = r.find("events"); evs != r.end() && evs->is_array()) {
      for (const json& e : *evs) {
        WatchEvent ev;
        ev.deleted = e.value("type", std::string()) == "DELETE";
        ev.kv = kv_of(e.value("kv", json::object()));
        next = std::max(next, ev.kv.mod_revision + 1);
        on_event(ev);
      }
    }
    return true;
  };
  auto j = SLUICE_ETCD_CALLER.call("watch", json{{"create_request", create}}, wait, stop, &on_line);
  if (!j && stop != nullptr && stop->load()) return next;  // stopped before it began
  if (!j) return j.status();
  if (!failed.is_ok()) return failed;
  return next;
}

#undef SLUICE_ETCD_CALLER

}  // namespace sluice::cluster
