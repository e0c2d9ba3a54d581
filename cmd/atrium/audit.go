package main

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
)

// Defaults of `atrium audit`.
const (
	DefaultAuditLimit = 50
	// auditPageSize is the most entries asked for in one request.
	auditPageSize = 200
)

func newAuditCmd(env *cliEnv) *cobra.Command {
	var (
		conn         connFlags
		q            client.AuditQuery
		sessionFlag  string
		since, until string
		limit        int
		asJSON       bool
	)
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show the audit log of your tenant (tenant admins)",
		Long: `Show the audit log of your tenant, newest first: logins and failed
authentications, API token creation and revocation, membership and role
changes, session creation and deletion, and requests refused for lack of a
role, with who, when and from where. Only tenant admins may read it.

Actions: login, login_failed, logout, auth_failed, token_created,
token_revoked, member_changed, session_created, session_deleted, denied,
secret_set, secret_deleted, egress_set, task_started, schedule_created,
schedule_deleted, schedule_paused, schedule_resumed, schedule_run,
dead_letter_retried, dead_letter_dropped, webhook_subscribed,
webhook_unsubscribed, model_call (one per call through the node's model
gateway: provider/model, tokens and cost, never the prompt).

--since and --until take a duration before now (24h, 7d), a date
(2026-01-31, midnight local time) or an RFC 3339 time. --limit is the most
entries shown; atrium pages through the log until it has them.`,
		Example: `  atrium audit
  atrium audit --action denied --since 24h
  atrium audit --actor alice@example.com --limit 500
  atrium audit --session s_8f3k2 --json | jq -r '.[].action'`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			now := time.Now()
			if limit < 1 {
				return usageError(cmd, "--limit must be at least 1")
			}
			if sessionFlag != "" {
				id := session.ID(sessionFlag)
				if err := id.Validate(); err != nil {
					return usageError(cmd, "--session: %v", err)
				}
				q.Session = id
			}
			var err error
			if since != "" {
				if q.Since, err = parseTime(since, now, -1); err != nil {
					return usageError(cmd, "--since: %v", err)
				}
			}
			if until != "" {
				if q.Until, err = parseTime(until, now, -1); err != nil {
					return usageError(cmd, "--until: %v", err)
				}
			}
			if !q.Since.IsZero() && !q.Until.IsZero() && !q.Since.Before(q.Until) {
				return usageError(cmd, "--since must be before --until")
			}
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			entries, more, err := readAudit(cmd, c, q, limit)
			if err != nil {
				var se *session.Error
				if errors.As(err, &se) && se.Code == session.CodeForbidden {
					return cliError{err: err, msg: "only tenant admins may read the audit log",
						hint: "ask a tenant admin; 'atrium whoami' shows whether you are one"}
				}
				return explainTokens(err, conn.server)
			}
			if asJSON {
				return writeJSON(env.stdout, entries)
			}
			if len(entries) == 0 {
				fmt.Fprintln(env.stderr, "No audit entries match.")
				return nil
			}
			if err := printAudit(env, entries, now); err != nil {
				return err
			}
			if more {
				fmt.Fprintf(env.stderr, "(the newest %d shown; older ones with --limit or --until)\n", len(entries))
			}
			return nil
		},
	}
	conn.register(cmd)
	f := cmd.Flags()
	f.StringVar(&q.Actor, "actor", "", "only entries of this user")
	f.StringVar(&q.Action, "action", "", "only entries of this action (see above)")
	f.StringVar(&sessionFlag, "session", "", "only entries about this session")
	f.StringVar(&since, "since", "", "only entries at or after this time (24h, 7d, 2026-01-31, RFC 3339)")
	f.StringVar(&until, "until", "", "only entries before this time")
	f.IntVar(&limit, "limit", DefaultAuditLimit, "the most entries to show")
	f.BoolVar(&asJSON, "json", false, "print a JSON array of entries")
	return cmd
}

// readAudit pages through the audit log until it has limit entries or the
// log ends; more reports whether entries were left.
func readAudit(cmd *cobra.Command, c *client.Client, q client.AuditQuery, limit int) (entries []client.AuditEntry, more bool, err error) {
	entries = []client.AuditEntry{}
	for {
		q.Limit = min(limit-len(entries), auditPageSize)
		page, err := c.Audit(cmd.Context(), q)
		if err != nil {
			return nil, false, err
		}
		entries = append(entries, page.Entries...)
		if len(entries) >= limit {
			return entries[:limit], len(entries) > limit || page.Next != "", nil
		}
		if page.Next == "" {
			return entries, false, nil
		}
		if page.Next == q.Cursor {
			return nil, false, fmt.Errorf("read the audit log: the server returned the same cursor twice")
		}
		q.Cursor = page.Next
	}
}

func printAudit(env *cliEnv, entries []client.AuditEntry, now time.Time) error {
	tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tACTOR\tACTION\tOUTCOME\tSESSION\tTARGET\tREMOTE\tDETAIL")
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return oneLine(s, 60)
	}
	for _, e := range entries {
		actor := e.Actor
		if actor == "" {
			actor = "(anonymous)"
		} else if e.Via != "" {
			actor += " (" + e.Via + ")"
		}
		fmt.Fprintln(tw, strings.Join([]string{
			clock(session.Time{Time: e.Time}, now), safeLine(dash(actor)), safeLine(dash(e.Action)), safeLine(dash(e.Outcome)),
			safeLine(dash(e.Session)), safeLine(dash(e.Target)), safeLine(dash(e.Remote)), safeLine(dash(e.Detail)),
		}, "\t"))
	}
	return tw.Flush()
}
