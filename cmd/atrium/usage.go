package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
)

// usagePageSize is how many events `atrium usage` asks for at once.
const usagePageSize = 1000

// usageRow is the spend of one session on one model.
type usageRow struct {
	Model        string  `json:"model"`
	Calls        int64   `json:"calls"`
	InputTokens  int64   `json:"input_tokens"`
	OutputTokens int64   `json:"output_tokens"`
	CachedTokens int64   `json:"cached_tokens"`
	CostUSD      float64 `json:"cost_usd"`
}

func (r *usageRow) add(u session.UsageData) {
	r.Calls++
	r.InputTokens += u.InputTokens
	r.OutputTokens += u.OutputTokens
	r.CachedTokens += u.CachedTokens
	r.CostUSD += u.CostUSD
}

func (r *usageRow) sum(o usageRow) {
	r.Calls += o.Calls
	r.InputTokens += o.InputTokens
	r.OutputTokens += o.OutputTokens
	r.CachedTokens += o.CachedTokens
	r.CostUSD += o.CostUSD
}

// sessionUsage is the spend of one session.
type sessionUsage struct {
	ID     session.ID `json:"id"`
	Title  string     `json:"title"`
	Tenant string     `json:"tenant,omitempty"`
	Models []usageRow `json:"models"`
	Total  usageRow   `json:"total"`
}

// usageReport is what `atrium usage --json` prints.
type usageReport struct {
	Sessions []sessionUsage `json:"sessions"`
	Total    usageRow       `json:"total"`
}

func newUsageCmd(env *cliEnv) *cobra.Command {
	var (
		conn        connFlags
		sessionFlag string
		tenant      string
		asJSON      bool
		myTenant    string
	)
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Show model spend (tokens and cost) of sessions",
		Long: `Show the model spend of your sessions: tokens and cost per session and model,
from the usage events the node's model gateway records for every model call
(docs/models.md). Costs come from the prices in the node's config; a model
without a price costs $0.

Without --session, every session you can see is counted: those of your
tenant where you are a member, all of your tenant's for a tenant admin
(--tenant checks that you are in that tenant). The totals are read from the sessions' histories, so
they include every call ever made, not just the current budget period.`,
		Example: `  atrium usage
  atrium usage --session s_8f3k2x9q4m2fdh2dnbw5
  atrium usage --tenant acme --json | jq .total.cost_usd`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			var list []session.Session
			if sessionFlag != "" {
				id := session.ID(sessionFlag)
				if err := id.Validate(); err != nil {
					return usageError(cmd, "--session: %v", err)
				}
				s, err := c.GetSession(ctx, id)
				if err != nil {
					return explain(err, conn.server)
				}
				list = []session.Session{s}
			} else {
				if tenant != "" {
					// A caller sees the sessions of its own tenant only
					// (a tenant admin sees all of them).
					w, err := c.Whoami(ctx)
					if err != nil {
						return explain(err, conn.server)
					}
					if w.Tenant != tenant {
						return fmt.Errorf("you are in tenant %q, not %q: atrium usage counts the sessions of your own tenant (all of them for a tenant admin)", w.Tenant, tenant)
					}
					myTenant = w.Tenant
				}
				all, err := c.ListSessions(ctx)
				if err != nil {
					return explain(err, conn.server)
				}
				list = all
			}
			rep := usageReport{Sessions: []sessionUsage{}}
			for _, s := range list {
				su, err := usageOf(ctx, c, s, myTenant)
				if err != nil {
					return explain(err, conn.server)
				}
				if len(su.Models) == 0 && sessionFlag == "" {
					continue
				}
				rep.Total.sum(su.Total)
				rep.Sessions = append(rep.Sessions, su)
			}
			if asJSON {
				return writeJSON(env.stdout, rep)
			}
			if len(rep.Sessions) == 0 {
				fmt.Fprintln(env.stderr, "no model usage: no session has called a model through the node's gateway")
				return nil
			}
			tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "SESSION\tMODEL\tCALLS\tINPUT\tOUTPUT\tCACHED\tCOST (USD)\t")
			for _, su := range rep.Sessions {
				for _, r := range su.Models {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%.4f\t\n", su.ID, r.Model, r.Calls, r.InputTokens, r.OutputTokens, r.CachedTokens, r.CostUSD)
				}
			}
			t := rep.Total
			fmt.Fprintf(tw, "total\t\t%d\t%d\t%d\t%d\t%.4f\t\n", t.Calls, t.InputTokens, t.OutputTokens, t.CachedTokens, t.CostUSD)
			return tw.Flush()
		},
	}
	conn.register(cmd)
	cmd.Flags().StringVar(&sessionFlag, "session", "", "only this session")
	cmd.Flags().StringVar(&tenant, "tenant", "", "only the sessions of this tenant")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

// usageOf sums the usage events of session s.
func usageOf(ctx context.Context, c *client.Client, s session.Session, tenant string) (sessionUsage, error) {
	su := sessionUsage{ID: s.ID, Title: s.Title, Tenant: tenant, Models: []usageRow{}}
	rows := map[string]*usageRow{}
	var after session.Seq
	for {
		page, err := c.Events(ctx, s.ID, after, usagePageSize)
		if err != nil {
			return su, err
		}
		for _, ev := range page.Events {
			after = ev.Seq
			if ev.Kind != session.KindUsage {
				continue
			}
			var u session.UsageData
			if err := json.Unmarshal(ev.Data, &u); err != nil {
				return su, fmt.Errorf("usage event %d of %s: %w", ev.Seq, s.ID, err)
			}
			r := rows[u.Model]
			if r == nil {
				r = &usageRow{Model: u.Model}
				rows[u.Model] = r
			}
			r.add(u)
		}
		if len(page.Events) == 0 || after >= page.LastSeq {
			break
		}
	}
	for _, r := range rows {
		su.Models = append(su.Models, *r)
		su.Total.sum(*r)
	}
	sort.Slice(su.Models, func(i, j int) bool { return su.Models[i].Model < su.Models[j].Model })
	return su, nil
}
