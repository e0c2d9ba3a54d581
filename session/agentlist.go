package session

// AgentInfo is one agent installed on a node: the version that sessions
// of it launch (GET /v1/agents).
type AgentInfo struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// AgentList answers a request on Subjects.Agents (one node's installed
// agents) and GET /v1/agents (those of every node that answered, each
// name and version once, sorted).
type AgentList struct {
	Agents []AgentInfo `json:"agents"`
}

// Agents is the subject every node answers (not in a queue group) with
// the AgentList of the agents installed on it, so a gateway collects
// them from all nodes.
func (s Subjects) Agents() string { return s.p() + ".agents" }
