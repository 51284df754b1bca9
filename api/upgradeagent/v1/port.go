// Package upgradeagentv1 is the node upgrade agent's API
// (upgradeagent.proto; docs/upgrades.md).
package upgradeagentv1

// DefaultPort is the TCP port a node's upgrade agent listens on
// (`gatehouse-bootstrapper serve-upgrade --listen`).
const DefaultPort = 9003
