// A client of etcd's v3 API as JSON over HTTP (the gRPC gateway: kv, lease,
// election, and watch as a stream of JSON lines). Keys and values are bytes,
// revisions and lease ids int64. Every call is one HTTP request on its own
// connection, bounded by the client's timeout, and returns a Status naming
// the endpoint and call: unavailable when no endpoint answered, precondition
// for an unknown lease, else etcd's message; nothing throws. A call goes to
// the endpoint that answered last and moves once around the list when one
// cannot be reached; etcd's own errors are not retried. docs/cluster.md has
// the keys.
//
// Thread safety: every method may be called from any number of threads at
// once (calls share only the preferred endpoint, an atomic).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/status.h"

namespace sluice::cluster {

struct KeyValue {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t version = 0;
  std::int64_t lease = 0;
};

struct RangeResult {
  std::int64_t revision = 0;  // the store's revision when it was read
  std::vector<KeyValue> kvs;
};

// One comparison of a transaction: the key's create or mod revision, version
// or value against a number or a value. A key that does not exist has
// revisions and version 0.
struct Compare {
  enum class Target : std::uint8_t { kCreate, kMod, kVersion, kValue };
  enum class Result : std::uint8_t { kEqual, kNotEqual, kGreater, kLess };
  std::string key;
  Target target = Target::kCreate;
  Result result = Result::kEqual;
  std::int64_t number = 0;  // for revisions and versions
  std::string value;        // for kValue

  static Compare create_revision(std::string key, std::int64_t rev) {
    return {std::move(key), Target::kCreate, Result::kEqual, rev, {}};
  }
  static Compare mod_revision(std::string key, std::int64_t rev) {
    return {std::move(key), Target::kMod, Result::kEqual, rev, {}};
  }
  static Compare value_is(std::string key, std::string value) {
    return {std::move(key), Target::kValue, Result::kEqual, 0, std::move(value)};
  }
};

// One operation of a transaction's branch.
struct TxnOp {
  enum class Kind : std::uint8_t { kPut, kDelete, kRange };
  Kind kind = Kind::kPut;
  std::string key;
  std::string value;       // kPut
  std::int64_t lease = 0;  // kPut: 0, none
  std::string range_end;   // kDelete, kRange: "" for the key alone

  static TxnOp put(std::string key, std::string value, std::int64_t lease = 0) {
    return {Kind::kPut, std::move(key), std::move(value), lease, {}};
  }
  static TxnOp del(std::string key) { return {Kind::kDelete, std::move(key), {}, 0, {}}; }
  static TxnOp get(std::string key) { return {Kind::kRange, std::move(key), {}, 0, {}}; }
};

struct TxnResult {
  bool succeeded = false;  // every compare held: the success branch ran
  std::int64_t revision = 0;
  std::vector<RangeResult> ranges;  // the kRange ops' results, in order
};

struct Lease {
  std::int64_t id = 0;
  std::int64_t ttl_s = 0;
};

// The key an election's leader holds (v3election's LeaderKey): rev is its
// create revision, what a leader's fenced writes compare against.
struct LeaderKey {
  std::string name;
  std::string key;
  std::int64_t rev = 0;
  std::int64_t lease = 0;
};

struct WatchEvent {
  bool deleted = false;
  KeyValue kv;  // for a deletion: the key and its mod revision
};

struct EtcdOptions {
  // "http://HOST:PORT" (or "HOST:PORT"), at least one.
  std::vector<std::string> endpoints;
  // Per call, connecting included.
  std::chrono::milliseconds timeout{2000};
};

class EtcdClient {
 public:
  // Checks the endpoints (errors name the one at fault); connects to none.
  static StatusOr<std::unique_ptr<EtcdClient>> create(EtcdOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // The end of the range of every key that starts with `prefix`.
  static std::string prefix_end(const std::string& prefix);

  // The key (range_end ""), or [key, range_end); revision 0: the latest.
  StatusOr<RangeResult> range(const std::string& key, const std::string& range_end = {},
                              std::int64_t revision = 0) const;
  StatusOr<RangeResult> range_prefix(const std::string& prefix) const {
    return range(prefix, prefix_end(prefix));
  }
  // The revision the put made.
  StatusOr<std::int64_t> put(const std::string& key, const std::string& value,
                             std::int64_t lease = 0) const;
  // How many keys were deleted.
  StatusOr<std::int64_t> delete_range(const std::string& key,
                                      const std::string& range_end = {}) const;
  StatusOr<TxnResult> txn(const std::vector<Compare>& compares, const std::vector<TxnOp>& success,
                          const std::vector<TxnOp>& failure = {}) const;

  StatusOr<Lease> lease_grant(std::int64_t ttl_s) const;
  // Renews the lease: its TTL again. A lease etcd no longer has (it
  // expired or was revoked): precondition.
  StatusOr<std::int64_t> lease_keepalive(std::int64_t id) const;
  Status lease_revoke(std::int64_t id) const;

  // Waits (at most `wait`, or until *stop turns true) to lead election
  // `name`, holding `lease`; the key it leads with. Timing out is
  // unavailable, and leaves no candidacy behind (etcd withdraws it when the
  // request goes); campaigning again with the same lease finds its own key.
  StatusOr<LeaderKey> campaign(const std::string& name, const std::string& value,
                               std::int64_t lease, std::chrono::milliseconds wait,
                               const std::atomic<bool>* stop = nullptr) const;
  // The current leader's key and value; nullopt when nobody leads.
  StatusOr<std::optional<KeyValue>> leader(const std::string& name) const;
  Status proclaim(const LeaderKey& leader, const std::string& value) const;
  Status resign(const LeaderKey& leader) const;

  // Watches the key (or [key, range_end)) from start_revision (0: from now)
  // for at most `wait` or until *stop turns true (checked between reads,
  // at least every 100 ms), calling on_event for each change in order. The
  // revision to watch from next (one past the last event's, or
  // start_revision when none came). Compacted history: precondition.
  StatusOr<std::int64_t> watch(const std::string& key, const std::string& range_end,
                               std::int64_t start_revision, std::chrono::milliseconds wait,
                               const std::atomic<bool>* stop,
                               const std::function<void(const WatchEvent&)>& on_event) const;

  const std::vector<std::string>& endpoints() const { return endpoints_; }

  struct Endpoint {
    std::string host;
    std::string port;
  };

 private:
  explicit EtcdClient(EtcdOptions options, std::vector<Endpoint> parsed);

  EtcdOptions opt_;
  std::vector<std::string> endpoints_;  // as given, for messages
  std::vector<Endpoint> parsed_;
  mutable std::atomic<std::size_t> preferred_{0};

  friend struct EtcdCall;
};

// Base64 (standard alphabet, padded): etcd's JSON form of bytes.
std::string base64_encode(const std::string& bytes);
// Nullopt when `text` is not base64.
std::optional<std::string> base64_decode(const std::string& text);

}  // namespace sluice::cluster
