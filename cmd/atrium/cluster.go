package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/session"
)

// clusterLeasesShown is how many sessions of each node `atrium cluster
// status` lists without --all.
const clusterLeasesShown = 20

func newClusterCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Inspect a running Atrium cluster",
	}
	var (
		conn   connFlags
		asJSON bool
		all    bool
	)
	status := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster's nodes, their sessions, lease ages and NATS health (tenant admins)",
		Long: `Show what the cluster looks like from the gateway at --server:

- every process heartbeating (gateways and nodes): its roles, state (running or
  draining), version, active sessions, the NATS server it is connected to, and
  how long ago its heartbeat was written (a process that stops heartbeating
  disappears after ` + server.NodeTTL.String() + `);
- the sessions each node owns, with the age of its ownership record and the time
  since the node's lease, which holds all of its sessions, was last renewed
  (renewals come every third of node.lease_ttl); records whose node has no
  heartbeat or no live lease are listed as orphaned: the node died or was cut
  off, and the next command for the session takes it over once that node's
  lease has expired;
- NATS: the server the gateway is connected to, the round trip, the JetStream
  account's usage and limits, and the replica health of Atrium's streams and
  buckets.

Only tenant admins may read it ('atrium dev' lets its dev identity read it).`,
		Example: `  atrium cluster status
  atrium cluster status --all                  # every session, not the first ` + fmt.Sprint(clusterLeasesShown) + ` per node
  atrium cluster status --json | jq '.nodes[] | {id, sessions: (.leases | length)}'
  atrium cluster status --server https://atrium.example.com`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			raw, err := c.ClusterStatus(cmd.Context())
			if err != nil {
				var se *session.Error
				if errors.As(err, &se) && se.Code == session.CodeForbidden {
					return cliError{err: err, msg: "only tenant admins may read the cluster status",
						hint: "ask a tenant admin; 'atrium whoami' shows whether you are one"}
				}
				return explainTokens(err, conn.server)
			}
			var st server.ClusterStatus
			if err := json.Unmarshal(raw, &st); err != nil {
				return fmt.Errorf("decode the cluster status from %s: %w", conn.server, err)
			}
			if asJSON {
				return writeJSON(env.stdout, st)
			}
			if err := printCluster(env.stdout, st, all); err != nil {
				return err
			}
			for _, e := range st.Errors {
				fmt.Fprintf(env.stderr, "warning: not shown: %s\n", e)
			}
			return nil
		},
	}
	conn.register(status)
	status.Flags().BoolVar(&asJSON, "json", false, "print the status as JSON")
	status.Flags().BoolVar(&all, "all", false, fmt.Sprintf("list every session of every node (default: the first %d)", clusterLeasesShown))
	cmd.AddCommand(status)
	setFlagErrors(cmd)
	return cmd
}

// printCluster writes st as tables.
func printCluster(w io.Writer, st server.ClusterStatus, all bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	leases := 0
	for _, n := range st.Nodes {
		leases += len(n.Leases)
	}
	fmt.Fprintf(tw, "NODES (%d processes, %d sessions owned)\n", len(st.Nodes), leases)
	fmt.Fprintln(tw, "ID\tROLES\tSTATE\tVERSION\tSESSIONS\tNATS SERVER\tUP\tHEARTBEAT")
	for _, n := range st.Nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s ago\n", n.ID, strings.Join(n.Roles, ","), n.State, orDash(n.Version),
			n.Sessions, orDash(n.NATSServer), fmtAgo(st.Time.Sub(n.Started)), fmtSecs(n.HeartbeatAge))
	}
	if len(st.Nodes) == 0 {
		fmt.Fprintln(tw, "(no process is heartbeating)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SESSION\tNODE\tLEASE AGE\tRENEWED\tFENCE")
	for _, n := range st.Nodes {
		for i, l := range n.Leases {
			if !all && i == clusterLeasesShown {
				fmt.Fprintf(tw, "… and %d more on %s (--all lists them)\t\t\t\t\n", len(n.Leases)-i, n.ID)
				break
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s ago\t%d\n", l.Session, l.Node, fmtSecs(l.Age), fmtSecs(l.Renewed), l.Fence)
		}
	}
	for _, l := range st.Orphaned {
		renewed := "node lease gone"
		if l.Renewed >= 0 {
			renewed = fmtSecs(l.Renewed) + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s (orphaned)\t%s\t%s\t%d\n", l.Session, l.Node, fmtSecs(l.Age), renewed, l.Fence)
	}
	if leases+len(st.Orphaned) == 0 {
		fmt.Fprintln(tw, "(no session is active: hibernated sessions hold no lease)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	n := st.NATS
	fmt.Fprintln(w)
	fmt.Fprintf(w, "NATS: connected to %s (%s)", orDash(n.Server), orDash(n.URL))
	if n.Cluster != "" {
		fmt.Fprintf(w, " in cluster %s", n.Cluster)
	}
	fmt.Fprintf(w, ", rtt %.1fms, %d servers known\n", n.RTT, len(n.Servers))
	if j := n.JetStream; j != nil {
		fmt.Fprintf(w, "JetStream: storage %s of %s, memory %s of %s, %d streams, %d consumers\n",
			fmtBytes(int64(j.Storage)), fmtLimit(j.MaxStorage), fmtBytes(int64(j.Memory)), fmtLimit(j.MaxMemory), j.Streams, j.Consumers)
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tREPLICAS\tLEADER\tMESSAGES\tBYTES\tHEALTH")
	for _, s := range n.Streams {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\n", s.Name, s.Replicas, orDash(s.Leader), s.Messages, fmtBytes(int64(s.Bytes)), streamHealth(s))
	}
	return tw.Flush()
}

// streamHealth says how a stream's replicas are.
func streamHealth(s server.StreamStatus) string {
	if s.Healthy {
		return "ok"
	}
	var bad []string
	if s.Replicas > 1 && s.Leader == "" {
		bad = append(bad, "no leader")
	}
	for _, p := range s.Peers {
		switch {
		case p.Offline:
			bad = append(bad, p.Name+" offline")
		case !p.Current:
			bad = append(bad, fmt.Sprintf("%s behind by %d", p.Name, p.Lag))
		}
	}
	if missing := s.Replicas - 1 - len(s.Peers); s.Leader != "" && missing > 0 {
		bad = append(bad, fmt.Sprintf("%d replicas missing", missing))
	}
	if len(bad) == 0 {
		bad = append(bad, "degraded")
	}
	return "DEGRADED: " + strings.Join(bad, ", ")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// fmtSecs formats a number of seconds like a duration, to a tenth of a second
// under a minute.
func fmtSecs(f float64) string {
	d := time.Duration(f * float64(time.Second))
	if d < time.Minute {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func fmtAgo(d time.Duration) string { return fmtSecs(d.Seconds()) }

func fmtLimit(n int64) string {
	if n < 0 {
		return "unlimited"
	}
	return fmtBytes(n)
}

// fmtBytes formats a byte count in binary units.
func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
