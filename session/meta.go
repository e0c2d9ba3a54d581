package session

// Meta is what a node keeps about a session besides its events: identity,
// ownership, membership and harness. The owner persists it in the session's
// history file and mirrors the public part to the catalog.
type Meta struct {
	ID        ID      `json:"id"`
	Title     string  `json:"title"`
	Owner     string  `json:"owner"`
	Tenant    string  `json:"tenant,omitempty"`
	Epoch     string  `json:"epoch"`
	CreatedAt Time    `json:"created_at"`
	Members   Members `json:"members"`
	Harness   Harness `json:"harness"`
	// Secrets are the session's secrets by name, injected into the harness
	// environment of every turn. They stay in the node's history file:
	// never in events, the catalog or a reply to a read.
	Secrets map[string]Secret `json:"secrets,omitempty"`
	// Egress is the session's own egress allowlist, normalized; the node
	// adds it to its default allowlist when it opens the session's sandbox.
	Egress []string `json:"egress,omitempty"`
	// AgentSession is the ACP session id of the session's agent (DESIGN
	// §6 "Agents"), so a new agent process can session/load it after
	// sleep, hibernation or a takeover; "" before the first agent turn.
	AgentSession string `json:"agent_session,omitempty"`
	// Usage is the running sum of the session's usage events up to and
	// including seq UsageSeq (actor/usage.go); nil before the first.
	Usage    *UsageTotals `json:"usage,omitempty"`
	UsageSeq Seq          `json:"usage_seq,omitempty"`
	// TurnTimeout is the session's own turn timeout in nanoseconds (PATCH
	// settings.turn_timeout), at most the node's; 0 is the node's.
	TurnTimeout int64 `json:"turn_timeout_ns,omitempty"`
	// MemoryBytes and Pids are the session's own sandbox limits (PATCH
	// settings), at most the node's; 0 is the node's.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	Pids        int   `json:"pids,omitempty"`
	// DiskBytes is the session's own workspace quota (PATCH
	// settings.disk_bytes), at most the node's; 0 is the node's.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// MCPServers are passed to the session's agent (PATCH
	// settings.mcp_servers). Their env and header values may be secrets:
	// never in events, the catalog or a reply to a read.
	MCPServers []MCPServer `json:"mcp_servers,omitempty"`
	// Setup is the session's setup command (PATCH settings.setup).
	Setup string `json:"setup,omitempty"`
	// InvokeConcurrency caps the session's invokes running at once (PATCH
	// settings.invoke_concurrency), within the gateways' cap; 0 is theirs.
	InvokeConcurrency int `json:"invoke_concurrency,omitempty"`
}

// Stored is an event as a history file stores it: its seq and kind, and the
// event's full JSON encoding, which is what clients receive byte for byte.
type Stored struct {
	Seq  Seq
	Kind Kind
	JSON []byte
}
