// Package compute defines what a sandbox is: the types every compute provider
// implements and the session actor drives, and the wire protocol of the
// sandbox agent. One sandbox per session; the harness runs in it once per
// turn with /workspace as its working directory.
//
// Providers: compute/local runs sandboxes under bubblewrap on this host;
// compute/remote drives `atrium sandbox-agent` (compute/sandboxagent) inside
// VMs that a provisioning hook creates. compute/computetest is the contract
// suite every provider passes. docs/compute.md describes both and the
// agent's API.
//
// # Fencing
//
// Every Open carries the caller's ownership fence (DESIGN §5). A provider
// remembers the highest fence it has seen per session and refuses anything
// older with an error matching session.ErrConflict, both at Open and through
// a handle returned by an older Open: a node that lost a session can no
// longer touch its sandbox.
//
// # Errors
//
// Providers return errors that match the session sentinels where the cause
// is known: session.ErrConflict for a stale fence, session.ErrNotFound for a
// destroyed sandbox, session.ErrBadRequest for an invalid request and
// session.ErrUnavailable when sandboxes cannot run (bubblewrap missing, a VM
// that cannot be provisioned or reached).
package compute

import (
	"context"
	"io"
	"syscall"

	"github.com/atriumhq/atrium/session"
)

// Spec describes the sandbox a session gets.
type Spec struct {
	Session session.ID
	// Fence is the ownership fencing token of the caller (DESIGN §5). A
	// provider rejects calls with a token older than one it has seen.
	Fence int64
	// MemoryBytes and Pids limit the whole sandbox; zero means the
	// provider's default.
	MemoryBytes int64
	Pids        int
	// CPUs limits the processor time of the whole sandbox, in CPUs: 0.5 is
	// half of one CPU's time, 2 is two CPUs' worth. Zero means the
	// provider's default (which may be no limit).
	CPUs float64
	// Network allows network access; sandboxes have none by default.
	Network bool
	// Egress lets a sandbox without Network reach these hosts, and only
	// these, through an HTTP proxy the node runs (commands get HTTP_PROXY
	// and HTTPS_PROXY): host names ("api.example.com"), wildcards for the
	// names below a domain ("*.example.com"), or IP addresses, each with
	// an optional ":port" (without one, ports 80 and 443). Setting both
	// Network and Egress is an error. See compute/egress.
	Egress []string
	// ModelSocket is the host path of the Unix socket where the node's
	// model gateway answers (DESIGN §6 "Model access"); "" when the node
	// runs none. The provider makes it reachable inside the sandbox at
	// ModelAddr, and nowhere else.
	ModelSocket string
	// Mounts are host directories made visible inside the sandbox, such as
	// the installed agent programs (read-only) and the session's agent
	// home.
	Mounts []Mount
	// DiskBytes is the size of the sandbox's workspace file system (a
	// session's settings.disk_bytes), at least 16 MiB; zero means the
	// provider's. A provider without workspace quotas ignores it. The
	// local provider applies it when the workspace's image is made or next
	// mounted (compute/local/quota.go).
	DiskBytes int64
}

// Mount is a host directory bound into a sandbox.
type Mount struct {
	Host     string `json:"host"`
	Sandbox  string `json:"sandbox"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// ModelAddr is where a sandbox reaches the node's model gateway: a
// loopback address inside the sandbox's own network namespace.
const ModelAddr = "127.0.0.1:4180"

// ModelEndpoints is how an agent in a sandbox reaches its models through the
// node's model gateway: a base URL per API family ("" when the node has no
// provider of that kind) and the scoped token the agent presents as its API
// key. Real keys never enter the sandbox.
type ModelEndpoints struct {
	// Anthropic is the base URL of the Anthropic Messages API, without
	// "/v1" (Anthropic's SDKs append it).
	Anthropic string `json:"anthropic,omitempty"`
	// OpenAI is the base URL of the OpenAI API, ending in "/v1".
	OpenAI string `json:"openai,omitempty"`
	// Gemini is the base URL of the Gemini API, without a version.
	Gemini string `json:"gemini,omitempty"`
	// Token is the session's scoped model token.
	Token string `json:"-"`
}

// ExecRequest is a command to run in a sandbox.
type ExecRequest struct {
	Argv []string `json:"argv"`
	// Env is added to the sandbox's minimal environment, as KEY=VALUE.
	// It may hold secrets: providers never log it.
	Env []string `json:"env,omitempty"`
	// Dir is the working directory inside the sandbox; default /workspace.
	Dir string `json:"dir,omitempty"`
}

// Exit is how a process ended.
type Exit struct {
	Code   int            `json:"code"`             // exit code, or -1 when killed by a signal or lost
	Signal syscall.Signal `json:"signal,omitempty"` // the signal that killed it, if any
	OOM    bool           `json:"oom,omitempty"`    // killed for exceeding the memory limit
	// Lost says that the sandbox itself died while the command ran (its VM
	// or agent vanished, the connection to it broke): the command's fate
	// is unknown, Code is -1 and Detail says what happened. The next Open
	// or Exec of the session provisions a fresh sandbox.
	Lost bool `json:"lost,omitempty"`
	// DiskFull says that the sandbox's workspace quota was full when the
	// command ended: its writes past it failed with ENOSPC.
	DiskFull bool   `json:"disk_full,omitempty"`
	Detail   string `json:"detail"` // a human-readable summary, e.g. "killed by SIGKILL"
}

// Process is a running command. Stdout and Stderr must be read until EOF
// before Wait returns reliably; Stdin is closed by the caller when the turn
// ends.
type Process interface {
	// Stdin is the command's standard input. A Write blocks while the
	// command does not read (the provider buffers a bounded amount) and
	// fails once the command has exited or closed its input.
	Stdin() io.WriteCloser
	// Stdout and Stderr are the command's outputs, streamed: a command
	// whose output nobody reads is slowed down, never buffered without
	// bound. They are independent: reading one while the other is unread
	// does not block.
	Stdout() io.Reader
	Stderr() io.Reader
	// Signal delivers sig to every process of the command, including its
	// children. SIGKILL leaves no process of the command behind.
	Signal(sig syscall.Signal) error
	// Wait waits for the command (and its pipes) to finish. Its error is
	// about waiting itself; how the command ended is in the Exit.
	Wait() (Exit, error)
}

// Sandbox is one session's machine, as seen through the handle that one
// Open returned (and that carries that Open's fence).
type Sandbox interface {
	// Exec starts a command, waking the sandbox if it sleeps or
	// provisioning a fresh one if it died. ctx bounds the start only: the
	// command runs until it exits or is signalled. Several commands may
	// run at once.
	Exec(ctx context.Context, req ExecRequest) (Process, error)
	State() session.SandboxState
	// Sleep stops everything running and releases resources, keeping the
	// workspace; the next Exec wakes it.
	Sleep(ctx context.Context) error
	// Destroy stops everything and deletes the workspace.
	Destroy(ctx context.Context) error
}

// Provider provisions or resumes sandboxes.
type Provider interface {
	// Open provisions the sandbox of spec.Session, or resumes the one it
	// has, and returns a handle carrying spec.Fence.
	Open(ctx context.Context, spec Spec) (Sandbox, error)
}

// The sandbox agent's wire protocol: the HTTP API that `atrium
// sandbox-agent` (compute/sandboxagent) serves inside a VM and compute/remote
// calls. It lives here, with the other types both sides share.
//
// Every request but GET /healthz carries `Authorization: Bearer <token>`
// (the sandbox's token) and AgentFenceHeader. Errors are
// `{"error":{"code","message"}}` with the status of the code, as on the
// gateway (DESIGN §7).
//
//	GET    /healthz               → AgentHealth (no authentication)
//	POST   /v1/sandbox            AgentOpen → 204: open or resume the sandbox
//	POST   /v1/sandbox/sleep      → 204
//	DELETE /v1/sandbox            → 204: destroy it (workspace included)
//	GET    /v1/exec               WebSocket (subprotocol AgentSubprotocol)
//	GET    /v1/model              WebSocket (AgentModelSubprotocol): a model tunnel
//	PUT    /v1/files/{path}       body → 204 (query mode=0644, octal)
//	GET    /v1/files/{path}       → the file's bytes
//
// An exec connection starts with an AgentExec text message from the node;
// the agent answers AgentMessage "started" (or "error", then closes). Then
// binary messages carry stream bytes, their first byte being the stream
// (AgentStdin, AgentStdout, AgentStderr), and text messages carry
// AgentMessage controls. Output flows under credit: the agent sends at most
// AgentExec.Window unacknowledged bytes per stream and the node returns
// "credit" as its reader consumes them; stdin flows the same way with the
// window of "started". The last message is "exit".
const (
	// AgentFenceHeader carries the caller's fence on every agent call.
	AgentFenceHeader = "Atrium-Fence"
	// AgentSubprotocol is the WebSocket subprotocol of an exec connection.
	AgentSubprotocol = "atrium-agent.v1"
	// AgentMaxMessage is the largest WebSocket message either side
	// accepts; a stream chunk is at most AgentMaxChunk bytes.
	AgentMaxMessage = 1 << 20
	// AgentMaxChunk is the largest stream payload of one message.
	AgentMaxChunk = 32 << 10
)

// Stream tags: the first byte of a binary message of an exec connection.
const (
	AgentStdin  byte = 0
	AgentStdout byte = 1
	AgentStderr byte = 2
)

// AgentHealth is the answer of GET /healthz.
type AgentHealth struct {
	Version  string `json:"version"`
	UptimeMS int64  `json:"uptime_ms"`
	// TimeMS is the guest's clock (Unix milliseconds): a VM host checks it
	// after a wake from sleep, when the guest's clock stood still. 0 from
	// agents older than it.
	TimeMS int64 `json:"time_ms,omitempty"`
}

// AgentOpen is the body of POST /v1/sandbox: the sandbox's session and
// limits.
type AgentOpen struct {
	Session     session.ID `json:"session"`
	MemoryBytes int64      `json:"memory_bytes,omitempty"`
	Pids        int        `json:"pids,omitempty"`
	Network     bool       `json:"network,omitempty"`
	// Model asks the agent to make the node's model gateway reachable in
	// the sandbox at ModelAddr: the node then keeps idle model tunnels
	// open (GET AgentModelPath, subprotocol AgentModelSubprotocol), and
	// the agent relays each connection its sandbox makes over one of them.
	Model bool `json:"model,omitempty"`
	// Egress is the sandbox's allowlist (Spec.Egress): the agent's own
	// egress proxy lets the sandbox reach these hosts and nothing else.
	Egress []string `json:"egress,omitempty"`
	// Mounts are Spec.Mounts as the agent makes them: node directories
	// have no meaning in a VM.
	Mounts []AgentMount `json:"mounts,omitempty"`
	// Suspended lists the suspended commands the node will attach again
	// (after a wake). The agent kills every other suspended command: the
	// node that suspended it is gone (a restarted or new owner cannot
	// attach to it), and it would keep the workspace from being restored
	// until its reattach timeout.
	Suspended []int64 `json:"suspended,omitempty"`
}

// AgentMount is a directory made visible in a VM's sandbox: a directory of
// the VM (the image's copy of an agent's program), or one the agent keeps
// for the sandbox, which Files are written into at every open (an agent's
// settings from the node's agent home).
type AgentMount struct {
	Sandbox  string `json:"sandbox"`
	ReadOnly bool   `json:"read_only,omitempty"`
	// VM is a directory of the VM; empty: the agent's own for Sandbox.
	VM string `json:"vm,omitempty"`
	// Files are written into the agent's own directory: relative
	// slash-separated paths to contents.
	Files map[string][]byte `json:"files,omitempty"`
}

// The model tunnel: a WebSocket connection the node opens to the agent and
// holds idle; when a program in the sandbox connects to ModelAddr, the
// agent pairs the connection with an idle tunnel and relays its bytes in
// binary messages both ways; the node relays them to its model gateway.
const (
	AgentModelPath        = "/v1/model"
	AgentModelSubprotocol = "atrium-model.v1"
)

// AgentExec is the first message of an exec connection.
type AgentExec struct {
	ExecRequest
	// Window is how many bytes of each output stream the node buffers:
	// the agent never has more than that unacknowledged.
	Window int64 `json:"window"`
}

// AgentMessage is a control message of an exec connection. Type says which
// fields are set:
//
//	started       agent→node  Window: the stdin window
//	error         agent→node  Error: the command could not start
//	credit        both        Stream, Bytes: the receiver consumed Bytes of Stream
//	eof           agent→node  Stream: stdout or stderr reached EOF
//	close_stdin   node→agent  close the command's stdin
//	stdin_closed  agent→node  Error: writing stdin failed; later writes fail
//	signal        node→agent  ID, Signal
//	signaled      agent→node  ID, Error (if the signal could not be sent)
//	exit          agent→node  Exit: the last message
type AgentMessage struct {
	Type   string         `json:"type"`
	Stream string         `json:"stream,omitempty"`
	Bytes  int64          `json:"bytes,omitempty"`
	Window int64          `json:"window,omitempty"`
	ID     int64          `json:"id,omitempty"`
	Signal syscall.Signal `json:"signal,omitempty"`
	Exit   *Exit          `json:"exit,omitempty"`
	Error  *session.Error `json:"error,omitempty"`
}
