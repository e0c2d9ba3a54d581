package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
)

func newTokenCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Create, list and revoke API tokens for bots and automation",
		Long: `API tokens let programs (CI jobs, bots, scripts) call Atrium without a
login. A token acts as the user who created it, optionally capped to a role
(--role viewer can only read, even where you are an owner), and stops working
when it expires or is revoked. The server stores only a hash of it: the token
is shown once, when it is created.

Use a token with --token or ATRIUM_TOKEN.`,
		Example: `  atrium token create --name ci --expires 30d --role driver
  atrium token ls
  atrium token revoke 3f9a1c2b7d4e`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError(cmd, "unknown command %q: want create, ls or revoke", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newTokenCreateCmd(env), newTokenLsCmd(env), newTokenRevokeCmd(env))
	return cmd
}

func newTokenCreateCmd(env *cliEnv) *cobra.Command {
	var (
		conn    connFlags
		name    string
		expires string
		role    string
		asJSON  bool
		boot    bootstrapFlags
	)
	cmd := &cobra.Command{
		Use:   "create --name NAME",
		Short: "Create an API token and print it (once)",
		Long: `Create an API token that acts as you, and print it. This is the only time
the token is shown: store it somewhere safe (a CI secret, a password manager)
right away. The token goes to stdout alone, the rest to stderr, so
TOKEN=$(atrium token create ...) works.

--expires takes a duration from now (30d, 720h, 90m), a date (2027-01-01,
midnight local time) or an RFC 3339 time; without it the server's default
applies. --role caps what the token may do on any session: viewer, driver or
owner; without it the token has all of your rights.

--bootstrap makes the first tokens of a server that accepts only API tokens
(auth.mode tokens), where nobody can log in to create one: run it on the
server's machine as a user who can read the server's data directory (--data,
or --config to read data_dir from the server's configuration). It reads the
key the server keeps there (bootstrap.key, mode 0600) and creates a token for
--user (default admin), who is made an admin of --tenant (default: the default
tenant) and an operator. Give the token to that person; they use it from
anywhere. Anyone who can read the data directory can do this, so keep it
readable by the server's user only.`,
		Example: `  atrium token create --name ci --expires 30d
  atrium token create --name dashboard --role viewer --expires 2027-01-01
  atrium token create --name deploy-bot --role driver --json | jq -r .token
  sudo -u atrium atrium token create --bootstrap --data /var/lib/atrium --user alice --name alice-laptop`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if strings.TrimSpace(name) == "" {
				return usageError(cmd, "--name is required: say what the token is for")
			}
			req := client.TokenRequest{Name: name}
			if expires != "" {
				t, err := parseExpires(expires, time.Now())
				if err != nil {
					return usageError(cmd, "--expires: %v", err)
				}
				req.ExpiresAt = t
			}
			if role != "" {
				r, err := session.ParseRole(role)
				if err != nil || !r.Valid() {
					return usageError(cmd, "--role %q: want viewer, driver or owner", role)
				}
				req.Role = r
			}
			var c *client.Client
			var err error
			if boot.on {
				c, err = boot.client(cmd, env, &conn)
			} else if boot.set(cmd) {
				return usageError(cmd, "--user, --tenant, --data and --config go with --bootstrap")
			} else {
				c, err = conn.client(cmd, env)
			}
			if err != nil {
				return err
			}
			t, err := c.CreateToken(cmd.Context(), req)
			if err != nil && boot.on && errors.Is(err, session.ErrUnauthenticated) {
				return cliError{err: err, msg: "the server at " + conn.server + " refused the bootstrap key: " + session.AsError(err).Message,
					hint: "run it on the machine of a server in auth.mode tokens, with --data (or --config) naming that server's data directory, and --server its address"}
			}
			if err != nil {
				return explainTokens(err, conn.server)
			}
			if asJSON {
				return writeJSON(env.stdout, t)
			}
			capNote := "all of your rights"
			if t.Info.Role != session.RoleNone {
				capNote = "role capped at " + string(t.Info.Role)
			}
			expNote := "never expires"
			if !t.Info.ExpiresAt.IsZero() {
				expNote = "expires " + t.Info.ExpiresAt.Local().Format("2006-01-02 15:04 MST")
			}
			fmt.Fprintf(env.stderr, "Created token %s %q (%s; %s).\n", t.Info.ID, t.Info.Name, capNote, expNote)
			fmt.Fprintln(env.stderr, "This is the only time it is shown: store it somewhere safe now.")
			_, err = fmt.Fprintln(env.stdout, t.Token)
			return err
		},
	}
	conn.register(cmd)
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "what the token is for (required)")
	f.StringVar(&expires, "expires", "", "when it expires: 30d, 720h, 2027-01-01 or an RFC 3339 time (default: the server's)")
	f.StringVar(&role, "role", "", "cap the token at viewer, driver or owner (default: all of your rights)")
	f.BoolVar(&asJSON, "json", false, `print {"token","info"} as JSON`)
	boot.register(cmd)
	return cmd
}

func newTokenLsCmd(env *cliEnv) *cobra.Command {
	var (
		conn   connFlags
		all    bool
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List your API tokens",
		Long: `List your API tokens (never their secrets): id, name, role cap, when each
was created, expires and was last used. Tenant admins may list every token of
the tenant with --all.`,
		Example: `  atrium token ls
  atrium token ls --all
  atrium token ls --json | jq -r '.[] | select(.name=="ci") | .id'`,
		Args:    exactArgs(),
		Aliases: []string{"list"},
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			list, err := c.ListTokens(cmd.Context(), all)
			if err != nil {
				var se *session.Error
				if all && errors.As(err, &se) && se.Code == session.CodeForbidden {
					return cliError{err: err, msg: "only tenant admins may list every token of the tenant",
						hint: "run 'atrium token ls' without --all to list yours"}
				}
				return explainTokens(err, conn.server)
			}
			if asJSON {
				if list == nil {
					list = []client.TokenInfo{}
				}
				return writeJSON(env.stdout, list)
			}
			if len(list) == 0 {
				fmt.Fprintln(env.stderr, "No API tokens. Create one with 'atrium token create --name NAME'.")
				return nil
			}
			return printTokens(env, list, all, time.Now())
		},
	}
	conn.register(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "every token of the tenant (tenant admins)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

func printTokens(env *cliEnv, list []client.TokenInfo, withUser bool, now time.Time) error {
	tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	head := "ID\tNAME\tROLE\tCREATED\tEXPIRES\tLAST USED"
	if withUser {
		head = "ID\tUSER\tNAME\tROLE\tCREATED\tEXPIRES\tLAST USED"
	}
	fmt.Fprintln(tw, head)
	for _, t := range list {
		role := string(t.Role)
		if role == "" {
			role = "-"
		}
		expires := "never"
		if !t.ExpiresAt.IsZero() {
			expires = day(t.ExpiresAt)
			if t.ExpiresAt.Before(now) {
				expires += " (expired)"
			}
		}
		used := "never"
		if !t.LastUsedAt.IsZero() {
			used = humanDuration(now.Sub(t.LastUsedAt)) + " ago"
		}
		cols := []string{t.ID, oneLine(t.Name, 40), role, day(t.CreatedAt), expires, used}
		if withUser {
			cols = append([]string{t.ID, t.User}, cols[1:]...)
		}
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
	}
	return tw.Flush()
}

func newTokenRevokeCmd(env *cliEnv) *cobra.Command {
	var conn connFlags
	var user string
	cmd := &cobra.Command{
		Use:   "revoke ID | --user USER",
		Short: "Revoke an API token, or every token of a user",
		Long: `Revoke an API token by its id (see 'atrium token ls'): it stops working at
once. You may revoke your own tokens; tenant admins may revoke any token of
the tenant. With --user, every token of that user is revoked (a tenant admin's
answer to a user who left).`,
		Example: `  atrium token revoke 3f9a1c2b7d4e
  atrium token revoke --user bob@example.com
  atrium token ls --json | jq -r '.[] | select(.name=="ci") | .id' | xargs -n1 atrium token revoke`,
		Args: func(cmd *cobra.Command, args []string) error {
			if user != "" {
				return exactArgs()(cmd, args)
			}
			return exactArgs("ID")(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if user != "" {
				c, err := conn.client(cmd, env)
				if err != nil {
					return err
				}
				infos, err := c.RevokeUserTokens(cmd.Context(), user)
				if err != nil {
					return explainTokens(err, conn.server)
				}
				_, err = fmt.Fprintf(env.stdout, "Revoked %d token(s) of %s.\n", len(infos), safeText(user))
				return err
			}
			id := args[0]
			if rest, ok := strings.CutPrefix(id, "atr_"); ok {
				// A whole token was pasted: its id is the part before the
				// secret. Never echo the secret back.
				id, _, _ = strings.Cut(rest, "_")
			}
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			if err := c.RevokeToken(cmd.Context(), id); err != nil {
				var se *session.Error
				if errors.As(err, &se) && se.Code == session.CodeNotFound {
					return cliError{err: err, msg: "no token " + id + " that you may revoke",
						hint: "list your tokens with 'atrium token ls'"}
				}
				return explainTokens(err, conn.server)
			}
			_, err = fmt.Fprintf(env.stdout, "Revoked token %s.\n", id)
			return err
		},
	}
	cmd.Flags().StringVar(&user, "user", "", "revoke every API token of this user")
	conn.register(cmd)
	return cmd
}

// explainTokens is explain with the hints of the identity commands.
func explainTokens(err error, server string) error {
	var se *session.Error
	if errors.As(err, &se) && se.Code == session.CodeForbidden {
		return cliError{err: err, msg: se.Message, hint: "this needs more rights than your credentials have (a capped API token, or not a tenant admin)"}
	}
	if errors.As(err, &se) && se.Code == session.CodeNotFound && strings.HasPrefix(se.Message, "no route") {
		return cliError{err: err, msg: "the server at " + server + " does not support this: " + se.Message,
			hint: "it may be an older Atrium server"}
	}
	return explain(err, server)
}

// parseExpires reads --expires: a duration from now ("30d", "720h"), a
// date (local midnight) or an RFC 3339 time. It must be in the future.
func parseExpires(s string, now time.Time) (time.Time, error) {
	t, err := parseTime(s, now, +1)
	if err != nil {
		return time.Time{}, err
	}
	if !t.After(now) {
		return time.Time{}, fmt.Errorf("%q is in the past", s)
	}
	return t, nil
}

// parseTime reads a duration (from now, in direction dir: +1 ahead, -1
// ago), "Nd" days, a date "2006-01-02" (local midnight) or an RFC 3339
// time.
func parseTime(s string, now time.Time, dir int) (time.Time, error) {
	s = strings.TrimSpace(s)
	if d, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.Atoi(d); err == nil && n > 0 && n < 100000 {
			return now.Add(time.Duration(dir) * time.Duration(n) * 24 * time.Hour), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return time.Time{}, fmt.Errorf("%q: a duration must be positive", s)
		}
		return now.Add(time.Duration(dir) * d), nil
	}
	if t, err := time.ParseInLocation("2006-01-02", s, time.Local); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%q is not a duration (30d, 12h), a date (2027-01-01) or an RFC 3339 time", s)
}

// day formats t as a local date and time to the minute.
func day(t time.Time) string {
	return t.Local().Format("2006-01-02 15:04")
}

// humanDuration rounds d to what a person wants to read: 45s, 12m, 3h5m,
// 4d.
func humanDuration(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	switch {
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s"
	case d < time.Hour:
		return strconv.Itoa(int(d.Minutes())) + "m"
	case d < 48*time.Hour:
		h, m := int(d.Hours()), int(d.Minutes())%60
		if m == 0 {
			return strconv.Itoa(h) + "h"
		}
		return fmt.Sprintf("%dh%dm", h, m)
	}
	return strconv.Itoa(int(d.Hours()/24)) + "d"
}
