// Command atrium is Atrium's one binary: the server roles (`atrium dev` runs
// gateway, node, embedded NATS and local sandboxes in one process), the
// benchmark runner, and the CLI client (new, ls, send, logs, attach, …).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/compute/egress"
	"github.com/atriumhq/atrium/compute/vmhost"
)

func main() {
	// Inside a sandbox with an egress allowlist, this binary also runs as
	// the forwarder from the sandbox's loopback to the node's proxy.
	if egress.IsForwarder(os.Args) {
		os.Exit(egress.RunForwarder(os.Args, os.Stdout, os.Stderr))
	}
	// QEMU runs `atrium vmhost relay ADDR` for each connection of a VM to
	// its VM host's outbound proxy: before anything may write to stderr,
	// which is that connection.
	if vmhost.IsRelay(os.Args) {
		os.Exit(vmhost.RunRelay(os.Args))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	if err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			if ee.msg != "" {
				fmt.Fprintln(os.Stderr, "atrium: "+safeText(ee.msg))
			}
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "atrium: "+safeText(err.Error()))
		os.Exit(1)
	}
}

// cliEnv is what commands may touch of the outside world; tests supply
// their own.
type cliEnv struct {
	stdout, stderr io.Writer
	stdin          io.Reader
	getenv         func(string) string
}

// exitError asks main to exit with code after printing msg (if any).
type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return fmt.Sprintf("exit status %d: %s", e.code, e.msg) }

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) error {
	// What others wrote reaches the terminal only as visible text
	// (termsafe.go). Standard output that is not a terminal is data for a
	// program, passed as it is; standard error is only ever messages.
	if isTerminal(stdout) {
		stdout = newSafeWriter(stdout)
	}
	stderr = newSafeWriter(stderr)
	env := &cliEnv{stdout: stdout, stderr: stderr, stdin: stdin, getenv: getenv}
	root := newRootCmd(env)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	return root.ExecuteContext(ctx)
}

func newRootCmd(env *cliEnv) *cobra.Command {
	root := &cobra.Command{
		Use:   "atrium",
		Short: "A shared home for AI agent sessions",
		Long: `Atrium coordinates AI agent sessions that people and programs share: they prompt a
session, watch it live together, drop and resume where they left off, while the agent
works in an isolated sandbox and the session remembers everything durably.

Start a single-machine server with 'atrium dev', then use the client commands.`,
		Example: `  atrium dev                      # run everything on this machine
  atrium new --title demo         # create a session, prints its id
  atrium send ID 'uname -a' --wait
  atrium attach ID                # live view; type prompts`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddGroup(&cobra.Group{ID: "server", Title: "Server commands:"}, &cobra.Group{ID: "client", Title: "Client commands:"})
	for _, c := range []*cobra.Command{newDevCmd(env), newServeCmd(env), newConfigCmd(env), newDoctorCmd(env), newClusterCmd(env), newBenchCmd(env), newAgentsCmd(env), newVMHostCmd(env)} {
		c.GroupID = "server"
		root.AddCommand(c)
	}
	root.AddCommand(newSandboxAgentCmd(env))
	for _, c := range append(append(clientCommands(env), fileCommands(env)...), settingsCommands(env)...) { // files.go, settings.go
		if c.GroupID == "" {
			c.GroupID = "client"
		}
		root.AddCommand(c)
	}
	return root
}
