// Who may do what over the daemon's socket (docs/protocol.md, "Who may do
// what"). Identity is the uid the kernel reports for a connection
// (SO_PEERCRED), never one a peer claims.
//
//   administrator: root, the daemon's own uid, and every --admin-uid
//   admitted:      an administrator, or a uid listed with --allow-uid
//
// Any admitted uid may read (list stages, statistics, the policy) and connect
// stages of its own; rules for a stage only its owner (the uid of the stage's
// connection) or an administrator may apply; only an administrator may set
// the policy. Everyone else is refused at connect.
//
// Thread safety: AccessRules is a value; authorize() is a pure function.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "sluice/status.h"

namespace sluice::control {

enum class Action : std::uint8_t {
  kConnect,     // open a connection at all
  kRead,        // list_stages, get_stats, policy_show
  kHello,       // register as a stage (owned by the connection's uid)
  kApplyRules,  // apply_rules to one stage
  kSetPolicy,   // policy_set
};
std::string_view action_name(Action a) noexcept;

struct AccessRules {
  std::uint32_t daemon_uid = 0;
  std::vector<std::uint32_t> admin_uids;  // besides root and daemon_uid
  std::vector<std::uint32_t> allow_uids;  // admitted, not administrators

  bool is_admin(std::uint32_t uid) const noexcept;
  bool admits(std::uint32_t uid) const noexcept;
};

// OK when `uid` may do `action`; else kPermissionDenied with a message that
// names the action and the uid. For kApplyRules, `stage` and `stage_owner`
// name the target stage and the uid that owns it.
Status authorize(const AccessRules& rules, std::uint32_t uid, Action action,
                 std::string_view stage = {}, std::uint32_t stage_owner = 0);

}  // namespace sluice::control
