package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	// Schedules name IANA time zones (--tz): the binary carries the zone
	// database, so that a host or image without /usr/share/zoneinfo
	// knows them too.
	_ "time/tzdata"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
)

// schedulePollInterval is how often `atrium schedule run --wait` reads the
// schedule's last run.
const schedulePollInterval = time.Second

// newScheduleCmd is `atrium schedule create|ls|show|pause|resume|run|delete`.
func newScheduleCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "schedule",
		Short: "Prompt sessions on a cron schedule, with nobody connected",
		Long: `A schedule sends a prompt at each tick of a cron expression: into one session
(--session ID), or into a new session created for each run (--new --title T;
its title gets the run's date). Runs act as you, with your own role, checked
again at each run: scheduling into a session needs the driver role on it, and
if you lose it, the run becomes a dead letter instead of a prompt
('atrium dlq ls'). Each tick fires once, whatever the number of gateways.

Ticks missed while no server was running are skipped (--missed skip, the
default) or run once for all of them (--missed run_once). Ticks that pass
while a schedule is paused are never run. See docs/automation.md, "Schedules".`,
		Example: `  atrium schedule create --cron "0 9 * * 1-5" --tz Europe/Paris --session ID --prompt "make report"
  atrium schedule create --cron @daily --new --title "Nightly build" --prompt "make test" --missed run_once
  atrium schedule ls
  atrium schedule run sc_3kq7xq4m2fdh2dnbw5ad --wait
  atrium schedule pause sc_3kq7xq4m2fdh2dnbw5ad`,
	}
	cmd.AddCommand(newScheduleCreateCmd(env), newScheduleLsCmd(env), newScheduleShowCmd(env),
		newSchedulePauseCmd(env, true), newSchedulePauseCmd(env, false), newScheduleRunCmd(env), newScheduleDeleteCmd(env))
	return cmd
}

func newScheduleCreateCmd(env *cliEnv) *cobra.Command {
	var (
		conn   connFlags
		spec   client.ScheduleSpec
		sid    string
		retry  retryFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "create --cron EXPR (--session ID | --new [--title T]) --prompt TEXT",
		Short: "Create a schedule; prints its id",
		Long: `Create a schedule and print its id. EXPR is a five-field cron expression
(minute hour day-of-month month day-of-week), read in --tz (default UTC), or a
descriptor: @hourly, @daily, @weekly, @monthly, @every 2h. Ticks are at least a
minute apart. --prompt - reads the prompt from stdin.

A run whose turn failed or timed out becomes a dead letter at once, unless
--retry-attempts N asks for up to N tries in all: the prompt is sent again to
the same session after --retry-backoff (doubled each time, up to
--retry-max-backoff). Failures on the server's side (no node, a sandbox that
did not start) are retried in any case.`,
		Example: `  atrium schedule create --cron "0 9 * * 1-5" --tz Europe/Paris --session ID --prompt "make report"
  atrium schedule create --cron "*/30 * * * *" --session ID --prompt "git pull && make test"
  atrium schedule create --cron @daily --new --title "Nightly build" --prompt - < prompt.txt
  atrium schedule create --cron @hourly --session ID --prompt "fix the lint" --retry-attempts 3 --retry-backoff 1m`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case spec.Cron == "":
				return usageError(cmd, `--cron is required, e.g. --cron "0 9 * * 1-5" (09:00 on weekdays)`)
			case spec.Prompt == "":
				return usageError(cmd, "--prompt is required: the text sent at each tick (- reads it from stdin)")
			case sid == "" && !spec.New:
				return usageError(cmd, "give --session ID (prompt that session) or --new (a new session at each run)")
			case sid != "" && spec.New:
				return usageError(cmd, "give --session or --new, not both")
			case spec.Title != "" && !spec.New:
				return usageError(cmd, "--title names the sessions --new creates; it needs --new")
			}
			policy, err := retry.policy(cmd)
			if err != nil {
				return err
			}
			spec.Retry = policy
			text, err := readPrompt(cmd, env, spec.Prompt)
			if err != nil {
				return err
			}
			spec.Prompt, spec.Session = text, session.ID(sid)
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			sc, err := c.CreateSchedule(cmd.Context(), spec)
			if err != nil {
				return explainAutomation(err, conn.server, "schedule")
			}
			if asJSON {
				return writeJSON(env.stdout, sc)
			}
			fmt.Fprintln(env.stdout, sc.ID)
			fmt.Fprintf(env.stderr, "schedule %s created: %s\n", sc.ID, scheduleNextRun(sc))
			return nil
		},
	}
	conn.register(cmd)
	f := cmd.Flags()
	f.StringVar(&spec.Cron, "cron", "", `cron expression, e.g. "0 9 * * 1-5" or @daily (required)`)
	f.StringVar(&spec.TZ, "tz", "", "IANA time zone the expression is read in, e.g. Europe/Paris (default UTC)")
	f.StringVar(&sid, "session", "", "session to prompt at each tick")
	f.BoolVar(&spec.New, "new", false, "create a new session at each tick instead")
	f.StringVar(&spec.Title, "title", "", `title of the sessions --new creates, followed by the run's date (default "Scheduled run")`)
	f.StringVar(&spec.Prompt, "prompt", "", "text sent at each tick; - reads it from stdin (required)")
	f.StringVar(&spec.Missed, "missed", "skip", "ticks missed while no server ran: skip, or run_once")
	retry.register(cmd)
	f.BoolVar(&asJSON, "json", false, "print the schedule as JSON")
	return cmd
}

func newScheduleLsCmd(env *cliEnv) *cobra.Command {
	var (
		conn   connFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List your schedules (a tenant admin sees the tenant's)",
		Example: `  atrium schedule ls
  atrium schedule ls --json | jq -r '.[] | select(.paused) | .id'`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			list, err := c.ListSchedules(cmd.Context())
			if err != nil {
				return explainAutomation(err, conn.server, "schedule")
			}
			if asJSON {
				if list == nil {
					list = []client.Schedule{}
				}
				return writeJSON(env.stdout, list)
			}
			if len(list) == 0 {
				fmt.Fprintln(env.stderr, `no schedules; create one with: atrium schedule create --cron "0 9 * * 1-5" --session ID --prompt TEXT`)
				return nil
			}
			tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tCRON\tTZ\tTARGET\tNEXT RUN\tLAST RUN\tCREATOR")
			for _, sc := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sc.ID, sc.Cron, sc.TZ, scheduleTarget(sc), scheduleNext(sc), scheduleLast(sc), sc.Creator)
			}
			return tw.Flush()
		},
	}
	conn.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the schedules as a JSON array")
	return cmd
}

func newScheduleShowCmd(env *cliEnv) *cobra.Command {
	var (
		conn   connFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show a schedule and how its last run went",
		Example: `  atrium schedule show sc_3kq7xq4m2fdh2dnbw5ad
  atrium schedule show sc_3kq7xq4m2fdh2dnbw5ad --json | jq .last_run`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			sc, err := c.GetSchedule(cmd.Context(), args[0])
			if err != nil {
				return explainAutomation(err, conn.server, "schedule")
			}
			if asJSON {
				return writeJSON(env.stdout, sc)
			}
			printSchedule(env.stdout, sc)
			return nil
		},
	}
	conn.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the schedule as JSON")
	return cmd
}

func newSchedulePauseCmd(env *cliEnv, pause bool) *cobra.Command {
	var (
		conn   connFlags
		asJSON bool
	)
	use, short, example := "pause ID", "Stop a schedule's runs until it is resumed",
		"  atrium schedule pause sc_3kq7xq4m2fdh2dnbw5ad"
	if !pause {
		use, short, example = "resume ID", "Resume a paused schedule (ticks that passed meanwhile are not run)",
			"  atrium schedule resume sc_3kq7xq4m2fdh2dnbw5ad"
	}
	cmd := &cobra.Command{
		Use: use, Short: short, Example: example,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			sc, err := c.PauseSchedule(cmd.Context(), args[0], pause)
			if err != nil {
				return explainAutomation(err, conn.server, "schedule")
			}
			if asJSON {
				return writeJSON(env.stdout, sc)
			}
			if pause {
				fmt.Fprintf(env.stdout, "schedule %s paused (resume it with: atrium schedule resume %s)\n", sc.ID, sc.ID)
			} else {
				fmt.Fprintf(env.stdout, "schedule %s resumed: %s\n", sc.ID, scheduleNextRun(sc))
			}
			return nil
		},
	}
	conn.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the schedule as JSON")
	return cmd
}

func newScheduleRunCmd(env *cliEnv) *cobra.Command {
	var (
		conn   connFlags
		wait   bool
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "run ID",
		Short: "Run a schedule once now, outside its timing",
		Long: `Run a schedule once now, as its creator, whatever its timing (its next tick
stays as it was; a paused schedule runs too). With --wait, wait until the run
has ended and say how it went: exit 1 if it became a dead letter.`,
		Example: `  atrium schedule run sc_3kq7xq4m2fdh2dnbw5ad --wait`,
		Args:    exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			sc, err := c.RunSchedule(ctx, args[0])
			if err != nil {
				return explainAutomation(err, conn.server, "schedule")
			}
			if !wait {
				if asJSON {
					return writeJSON(env.stdout, sc)
				}
				fmt.Fprintf(env.stdout, "schedule %s is running; see how it went with: atrium schedule show %s\n", sc.ID, sc.ID)
				return nil
			}
			fmt.Fprintf(env.stderr, "schedule %s is running…\n", sc.ID)
			sc, err = waitRun(ctx, c, sc.ID)
			if err != nil {
				if interrupted(ctx) {
					return cliError{err: err, msg: "stopped waiting; the run goes on", hint: "see how it went with 'atrium schedule show " + sc.ID + "'"}
				}
				return explainAutomation(err, conn.server, "schedule")
			}
			if asJSON {
				if err := writeJSON(env.stdout, sc); err != nil {
					return err
				}
			} else {
				printSchedule(env.stdout, sc)
			}
			if r := sc.LastRun; r.Status == "dead_letter" {
				return cliError{msg: "the run failed: " + r.Error,
					hint: "once fixed, run it again: atrium dlq retry " + r.DeadLetter}
			}
			return nil
		},
	}
	conn.register(cmd)
	cmd.Flags().BoolVarP(&wait, "wait", "w", false, "wait for the run to end")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the schedule as JSON")
	return cmd
}

// waitRun polls schedule id until its last run has ended.
func waitRun(ctx context.Context, c *client.Client, id string) (client.Schedule, error) {
	t := time.NewTicker(schedulePollInterval)
	defer t.Stop()
	for {
		sc, err := c.GetSchedule(ctx, id)
		if err != nil {
			return client.Schedule{ID: id}, err
		}
		if sc.LastRun != nil && sc.LastRun.Status != "running" {
			return sc, nil
		}
		select {
		case <-ctx.Done():
			return client.Schedule{ID: id}, ctx.Err()
		case <-t.C:
		}
	}
}

func newScheduleDeleteCmd(env *cliEnv) *cobra.Command {
	var conn connFlags
	cmd := &cobra.Command{
		Use:     "delete ID",
		Aliases: []string{"rm"},
		Short:   "Delete a schedule (a run under way finishes)",
		Example: `  atrium schedule delete sc_3kq7xq4m2fdh2dnbw5ad`,
		Args:    exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			if err := c.DeleteSchedule(cmd.Context(), args[0]); err != nil {
				return explainAutomation(err, conn.server, "schedule")
			}
			fmt.Fprintf(env.stdout, "schedule %s deleted\n", args[0])
			return nil
		},
	}
	conn.register(cmd)
	return cmd
}

// printSchedule prints sc for people.
func printSchedule(w io.Writer, sc client.Schedule) {
	state := "active"
	if sc.Paused {
		state = "paused"
	}
	fmt.Fprintf(w, "schedule  %s (%s)\ncreator   %s\ncron      %s (%s)\ntarget    %s\nmissed    %s\nretries   %s\nnext run  %s\n",
		sc.ID, state, sc.Creator, sc.Cron, sc.TZ, scheduleTarget(sc), sc.Missed, retryDetail(sc.Retry), scheduleNext(sc))
	r := sc.LastRun
	if r == nil {
		fmt.Fprintln(w, "last run  never")
		return
	}
	fmt.Fprintf(w, "last run  %s: %s", r.Tick.Local().Format(time.DateTime), r.Status)
	if r.ExitCode != nil {
		fmt.Fprintf(w, " (exit code %d)", *r.ExitCode)
	}
	if r.Missed > 0 {
		fmt.Fprintf(w, ", for %d missed tick(s) too", r.Missed)
	}
	fmt.Fprintln(w)
	if r.Session != "" {
		fmt.Fprintf(w, "session   %s (atrium logs %s)\n", r.Session, r.Session)
	}
	if r.Error != "" {
		fmt.Fprintf(w, "error     %s\n", r.Error)
	}
	if r.DeadLetter != "" {
		fmt.Fprintf(w, "dead letter %s (retry: atrium dlq retry %s)\n", r.DeadLetter, r.DeadLetter)
	}
}

func scheduleTarget(sc client.Schedule) string {
	if sc.New {
		return "new session: " + sc.Title
	}
	return string(sc.Session)
}

func scheduleNext(sc client.Schedule) string {
	switch {
	case sc.Paused:
		return "paused"
	case sc.NextRun == nil:
		return "never"
	}
	// In the schedule's own zone: "09:00" reads as the cron expression says.
	loc, err := time.LoadLocation(sc.TZ)
	if err != nil {
		loc = time.Local
	}
	return sc.NextRun.In(loc).Format("2006-01-02 15:04 MST (Mon)")
}

func scheduleNextRun(sc client.Schedule) string {
	if sc.Paused || sc.NextRun == nil {
		return "it is " + scheduleNext(sc)
	}
	return "next run " + scheduleNext(sc)
}

func scheduleLast(sc client.Schedule) string {
	if sc.LastRun == nil {
		return "-"
	}
	return sc.LastRun.Tick.Local().Format("01-02 15:04") + " " + sc.LastRun.Status
}

// explainAutomation is explain with hints for schedules and dead letters.
func explainAutomation(err error, server, what string) error {
	err = explain(err, server)
	ce, ok := err.(cliError)
	if !ok {
		return err
	}
	switch {
	case strings.HasPrefix(ce.hint, "list the sessions"):
		if what == "schedule" {
			ce.hint = "list your schedules with 'atrium schedule ls' (and the sessions you can see with 'atrium ls')"
		} else {
			ce.hint = "list your dead letters with 'atrium dlq ls'"
		}
	case strings.HasPrefix(ce.hint, "ask the session's owner"):
		ce.hint = "scheduled runs act with your own role: ask the session's owner for the driver role (atrium share ID YOU --role driver)"
	}
	return ce
}
