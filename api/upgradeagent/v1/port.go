package upgradeagentv1

// DefaultPort is the TCP port a node's upgrade agent listens on
// (`gatehouse-bootstrapper serve-upgrade --listen`).
const DefaultPort = 9003
