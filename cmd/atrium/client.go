package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
)

// Defaults of the client commands.
const (
	DefaultServer = "http://127.0.0.1:7080"
	envServer     = "ATRIUM_SERVER"
	envToken      = "ATRIUM_TOKEN"
)

// clientCommands returns the CLI client commands: new, ls, send, logs,
// attach, cancel, share, approve, rm, and the identity commands login,
// logout, whoami, token and audit. Each has its own --server (and --token).
func clientCommands(env *cliEnv) []*cobra.Command {
	cmds := []*cobra.Command{
		newNewCmd(env),
		newLsCmd(env),
		newSendCmd(env),
		newInvokeCmd(env),
		newLogsCmd(env),
		newAttachCmd(env),
		newCancelCmd(env),
		newShareCmd(env),
		newSecretCmd(env),
		newEgressCmd(env),
		newApproveCmd(env),
		newRmCmd(env),
		newLoginCmd(env),
		newLogoutCmd(env),
		newWhoamiCmd(env),
		newTokenCmd(env),
		newAuditCmd(env),
		newUsageCmd(env), // usage.go: model spend
		newTaskCmd(env),
		newScheduleCmd(env),
		newDLQCmd(env),
	}
	for _, c := range cmds {
		setFlagErrors(c)
	}
	return cmds
}

// setFlagErrors makes flag mistakes of c and its subcommands usage errors.
func setFlagErrors(c *cobra.Command) {
	c.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError(c, "%v", err)
	})
	for _, sub := range c.Commands() {
		setFlagErrors(sub)
	}
}

// connFlags are the flags that say which server to talk to, as whom.
type connFlags struct {
	server, token string
	// source says where the credentials came from, for whoami.
	source string
	// login is the stored login in use, if any.
	login *storedLogin
}

// Sources of a client's credentials, in the order they are looked for.
const (
	sourceFlag  = "--token"
	sourceEnv   = envToken
	sourceLogin = "login"
	sourceDev   = "dev"
)

const connHelp = `
Connection: --server (or ATRIUM_SERVER, default ` + DefaultServer + `) is the
gateway's URL. The credentials are, in this order: --token (or ATRIUM_TOKEN),
a bearer token such as an API token atr_...; the login stored by
'atrium login' for that server, refreshed as needed; or else dev:$USER (your
operating system's user name, or "dev"), the dev identity that 'atrium dev'
accepts from this machine and its banner's browser link uses too.`

func (f *connFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.server, "server", DefaultServer, "gateway URL (env "+envServer+")")
	cmd.Flags().StringVar(&f.token, "token", "", "bearer token (env "+envToken+"; default dev:$USER, the 'atrium dev' identity)")
	cmd.Long += "\n" + connHelp
}

// registerServer adds only --server, for commands that send no
// credentials (login, logout).
func (f *connFlags) registerServer(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.server, "server", DefaultServer, "gateway URL (env "+envServer+")")
}

// anonymous resolves --server and ATRIUM_SERVER into a Client that sends no
// credentials.
func (f *connFlags) anonymous(cmd *cobra.Command, env *cliEnv) (*client.Client, error) {
	server := f.server
	if !cmd.Flags().Changed("server") {
		if v := lookupEnv(env, envServer); v != "" {
			server = v
		}
	}
	c, err := client.New(server, "")
	if err != nil {
		return nil, usageError(cmd, "%v", err)
	}
	c.UserAgent = "atrium-cli/1"
	f.server = c.Server
	return c, nil
}

// client resolves the flags, environment, stored logins and defaults into
// a Client: --token / ATRIUM_TOKEN, else the stored login for the server
// (refreshed now if it is about to expire), else dev:$USER.
func (f *connFlags) client(cmd *cobra.Command, env *cliEnv) (*client.Client, error) {
	c, err := f.anonymous(cmd, env)
	if err != nil {
		return nil, err
	}
	switch {
	case cmd.Flags().Changed("token"):
		c.Token, f.source = f.token, sourceFlag
	case lookupEnv(env, envToken) != "":
		c.Token, f.source = lookupEnv(env, envToken), sourceEnv
	default:
		src, err := storedTokens(env, c.Server)
		if err != nil {
			return nil, err
		}
		if src == nil {
			c.Token, f.source = "dev:"+devUser(env.getenv), sourceDev
			break
		}
		// Refresh now, so an expired login is reported before the
		// command starts rather than in the middle of it.
		if _, err := src.Token(cmd.Context()); err != nil {
			return nil, err
		}
		c.Tokens, f.source, f.login = src, sourceLogin, src.login
	}
	return c, nil
}

// storedTokens returns the token source of the login stored for server,
// or nil when there is none (or no configuration directory to look in).
func storedTokens(env *cliEnv, server string) (*loginTokens, error) {
	store, err := newCredStore(env)
	if err != nil {
		return nil, nil // nowhere to look: no stored login
	}
	l, err := store.get(server)
	if err != nil || l == nil {
		return nil, err
	}
	return &loginTokens{store: store, server: server, now: time.Now, login: l}, nil
}

// lookupEnv reads an environment variable through env.
func lookupEnv(env *cliEnv, k string) string {
	if env.getenv == nil {
		return ""
	}
	return env.getenv(k)
}

// cliError is an error message for people: what went wrong and, on the next
// line, what to do about it.
type cliError struct {
	err  error
	msg  string
	hint string
}

func (e cliError) Error() string {
	if e.hint == "" {
		return e.msg
	}
	return e.msg + "\n  hint: " + e.hint
}

func (e cliError) Unwrap() error { return e.err }

// usageError is a command-line mistake: exit status 2.
func usageError(cmd *cobra.Command, format string, args ...any) error {
	return exitError{code: 2, msg: fmt.Sprintf(format, args...) + "\n  see '" + cmd.CommandPath() + " --help'"}
}

// exactArgs requires n arguments, named in the message.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(names) == 0 && len(args) > 0 {
			return usageError(cmd, "%s takes no arguments (got %q)", cmd.Name(), args)
		}
		if len(args) != len(names) {
			return usageError(cmd, "%s takes %d argument(s): %s (got %d)", cmd.Name(), len(names), strings.Join(names, " "), len(args))
		}
		return nil
	}
}

// explain turns an error into a message that says what to do next.
func explain(err error, server string) error {
	if err == nil {
		return nil
	}
	var ee exitError
	var ce cliError
	if errors.As(err, &ee) || errors.As(err, &ce) {
		return err
	}
	var se *session.Error
	if errors.As(err, &se) {
		msg := se.Message
		if msg == "" {
			msg = string(se.Code)
		}
		hint := ""
		switch se.Code {
		case session.CodeUnauthenticated:
			hint = "run 'atrium login', or pass --token or set " + envToken + " (a dev server accepts --token dev:<user>; " +
				"a new server in token mode: 'atrium token create --bootstrap' on its machine)"
		case session.CodeForbidden:
			switch {
			case strings.HasPrefix(msg, "settings:"):
				// Beyond a limit the operator sets, not a missing role.
				hint = "choose a value within the limit, or ask the server's operator to raise it"
			case strings.HasSuffix(msg, "(sandbox.egress_permit)"):
				hint = "a session may allow only hosts the server's operator permits: ask them to add it to sandbox.egress_permit"
			default:
				hint = "ask the session's owner for a role: atrium share ID YOU --role driver"
			}
		case session.CodeNotFound:
			hint = "list the sessions you can see with 'atrium ls'"
		case session.CodeTooManyRequests:
			hint = "the server is limiting requests; retry in a few seconds"
		case session.CodeUnavailable:
			hint = "the server is starting, restarting or overloaded; retry in a moment"
		case session.CodePayloadTooLarge:
			hint = fmt.Sprintf("prompts are limited to %d KiB", session.MaxTextBytes>>10)
		}
		return cliError{err: err, msg: msg, hint: hint}
	}
	if errors.Is(err, client.ErrEpochChanged) {
		return cliError{err: err, msg: "the session's history was rebuilt", hint: "start over without --after"}
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return cliError{err: err, msg: "cannot reach the Atrium server at " + server + ": connection refused",
			hint: "is the server running? start it with `make run` or `atrium dev`, or point --server / " + envServer + " at it"}
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return cliError{err: err, msg: "cannot find the host of " + server + ": " + dns.Err,
			hint: "check --server / " + envServer}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return cliError{err: err, msg: "the server at " + server + " did not answer in time", hint: "retry; check the server's logs"}
	}
	return err
}

// interrupted reports whether ctx ended because the user pressed Ctrl-C
// (or the process got SIGTERM).
func interrupted(ctx context.Context) bool {
	return errors.Is(ctx.Err(), context.Canceled)
}

// writeJSON prints v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// readPrompt returns arg, or all of stdin when arg is "-".
func readPrompt(cmd *cobra.Command, env *cliEnv, arg string) (string, error) {
	text := arg
	if arg == "-" {
		if env.stdin == nil {
			return "", usageError(cmd, "no stdin to read the prompt from")
		}
		b, err := io.ReadAll(io.LimitReader(env.stdin, session.MaxTextBytes+1))
		if err != nil {
			return "", fmt.Errorf("read prompt from stdin: %w", err)
		}
		text = strings.TrimRight(string(b), "\r\n")
	}
	if strings.TrimSpace(text) == "" {
		return "", usageError(cmd, "the prompt is empty")
	}
	return text, nil
}

// clock formats an event time for a line of output: the local time of day,
// with the date when it is not today.
func clock(t session.Time, now time.Time) string {
	lt := t.Local()
	if y, m, d := lt.Date(); y == now.Year() && m == now.Month() && d == now.Day() {
		return lt.Format("15:04:05")
	}
	return lt.Format("Jan 02 15:04:05")
}
