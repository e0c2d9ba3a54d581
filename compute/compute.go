// Package compute defines what a sandbox is: the types every compute provider
// implements (compute/local runs sandboxes under bubblewrap on this host) and
// the session actor drives. One sandbox per session; the harness runs in it
// once per turn with /workspace as its working directory.
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
	// Network allows network access; sandboxes have none by default.
	Network bool
}

// ExecRequest is a command to run in a sandbox.
type ExecRequest struct {
	Argv []string
	// Env is added to the sandbox's minimal environment, as KEY=VALUE.
	Env []string
	// Dir is the working directory inside the sandbox; default /workspace.
	Dir string
}

// Exit is how a process ended.
type Exit struct {
	Code   int            // exit code, or -1 when killed by a signal
	Signal syscall.Signal // the signal that killed it, if any
	OOM    bool           // killed for exceeding the memory limit
	Detail string         // a human-readable summary, e.g. "killed by SIGKILL"
}

// Process is a running command. Stdout and Stderr must be read until EOF
// before Wait returns reliably; Stdin is closed by the caller when the turn
// ends.
type Process interface {
	Stdin() io.WriteCloser
	Stdout() io.Reader
	Stderr() io.Reader
	// Signal delivers sig to every process of the command, including its
	// children. SIGKILL leaves no process of the command behind.
	Signal(sig syscall.Signal) error
	// Wait waits for the command (and its pipes) to finish.
	Wait() (Exit, error)
}

// Sandbox is one session's machine.
type Sandbox interface {
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
	Open(ctx context.Context, spec Spec) (Sandbox, error)
}
