package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/cmd/atrium/internal/bench"
	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/compute/agents"
	"github.com/atriumhq/atrium/compute/modelgw"
)

func newBenchCmd(env *cliEnv) *cobra.Command {
	cfg := bench.Config{}
	var (
		scenarios  string
		asJSON     bool
		unsafe     bool
		verbose    bool
		cpuProfile string
		memProfile string
		rampSteps  int
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure fan-out, append, wake-up, activation, memory and resume against an in-process server",
		Long: `Start in-process Atrium servers (embedded NATS, node, SQLite histories, local
sandboxes, gateway on loopback) and measure them through the client wire
protocol, as real clients would:

  fanout  one session, N WebSocket watchers: commit-to-receive latency at a
          steady rate, then the highest sustained deliveries/s (events ×
          watchers) with p99 ≤ 100 ms, and the server's CPU per delivery; the
          same through raw NATS for comparison
  append  acknowledged (durable) events/s into one session, over REST and
          over WebSocket
  wake    prompt → ack of a hibernated session
  activation
          hibernated sessions woken per second by 64 concurrent clients
          (history reads), and the latency of one wake under that load
  memory  server RSS per idle WebSocket watcher (watchers in a child
          process), goroutines/open files/RSS per hibernated session
  resume  replay of a long history to a client reconnecting with after=0

Watchers run in a child process (this binary, re-executed), so the server's
CPU time and memory are measured alone. Prints a table of median and p99 per
measure with its target; progress goes to stderr. The default run takes under two minutes. The figures are recorded
in docs/benchmarks.md.`,
		Example: `  atrium bench
  atrium bench --scenarios fanout --watchers 2000 --duration 10s
  atrium bench --scenarios wake,resume --json > bench.json
  atrium bench --scenarios activation --activation-sessions 5000
  atrium bench --scenarios fanout --cpuprofile fanout.pprof   # then: go tool pprof bin/atrium fanout.pprof`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if scenarios != "" && scenarios != "all" {
				for _, s := range strings.Split(scenarios, ",") {
					if s = strings.TrimSpace(s); s != "" {
						cfg.Scenarios = append(cfg.Scenarios, s)
					}
				}
			}
			cfg.MaxRampSteps = rampSteps
			if rampSteps <= 0 {
				cfg.MaxRampSteps = -1
			}
			if limit, err := bench.RaiseFileLimit(); err != nil {
				fmt.Fprintf(env.stderr, "bench: %v; large runs may fail with 'too many open files'\n", err)
			} else if need := uint64(4*cfg.Watchers + 1024); limit < need {
				fmt.Fprintf(env.stderr, "bench: the open-file limit is %d; %d watchers need about %d (raise it with ulimit -n)\n", limit, cfg.Watchers, need)
			}
			level := slog.LevelWarn
			if verbose {
				level = slog.LevelDebug
			}
			cfg.Logger = slog.New(slog.NewTextHandler(env.stderr, &slog.HandlerOptions{Level: level}))
			cfg.Progress = env.stderr
			cfg.Sandboxed = !unsafe
			cfg.Start = func(ctx context.Context, o bench.ServerOptions) (bench.Server, error) {
				sc := server.Config{
					Listen:          "127.0.0.1:0",
					DataDir:         o.DataDir,
					HibernateAfter:  o.HibernateAfter,
					UnsafeNoSandbox: unsafe,
					DrainGrace:      time.Second, // a benchmark's held turns need not finish
					Logger:          o.Logger,
				}
				if o.AgentBin != "" {
					sc.AgentsDir = o.AgentsDir
					sc.Agents = []agents.Spec{{Name: bench.AgentName, Package: "atrium-bench-scripted-agent", Version: "1.0.0", Bin: "acpagent",
						Env:             []string{"FAKE_ACP_STATE=/workspace/.fakeacp"},
						Model:           agents.Model{API: agents.APIAnthropic},
						PermissionModes: map[agents.Mode]agents.Settings{agents.ModeAsk: {}}}}
					// The scripted agent never calls its model; launching
					// it needs a provider of its API family.
					sc.Models = modelgw.Config{Providers: []modelgw.Provider{{Name: "anthropic", Kind: modelgw.KindAnthropic, BaseURL: "http://127.0.0.1:9", APIKey: "unused"}}}
				}
				return server.Start(ctx, sc)
			}
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find this program for the watcher process: %w", err)
			}
			cfg.Child = func(ctx context.Context, args ...string) *exec.Cmd {
				c := exec.CommandContext(ctx, exe, append([]string{"bench", "watchers"}, args...)...)
				c.WaitDelay = 10 * time.Second
				return c
			}
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return fmt.Errorf("create CPU profile: %w", err)
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return fmt.Errorf("start CPU profile: %w", err)
				}
				defer pprof.StopCPUProfile()
			}
			rep, err := bench.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if memProfile != "" {
				if err := writeAllocProfile(memProfile); err != nil {
					return err
				}
			}
			if asJSON {
				enc := json.NewEncoder(env.stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else if err := rep.WriteTable(env.stdout); err != nil {
				return err
			}
			if rep.Failed() {
				return exitError{code: 1, msg: "some measures could not be taken (see the table's notes)"}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&scenarios, "scenarios", "all", "comma-separated scenarios to run: "+strings.Join(bench.Scenarios(), ","))
	f.IntVar(&cfg.Watchers, "watchers", bench.DefaultWatchers, "WebSocket watchers (and raw NATS subscribers) for fanout and memory")
	f.DurationVar(&cfg.Duration, "duration", bench.DefaultDuration, "length of each timed phase (fan-out ramp steps last half of it)")
	f.IntVar(&cfg.Rate, "rate", bench.DefaultRate, "base fan-out rate in events/s; the ramp doubles it")
	f.IntVar(&rampSteps, "ramp-steps", bench.DefaultMaxRampSteps, "most doublings of the fan-out rate when searching for the maximum (0: no search)")
	f.IntVar(&cfg.Senders, "senders", bench.DefaultSenders, "concurrent REST senders for append and for filling the resume history")
	f.StringSliceVar(&cfg.AppendVia, "append-via", []string{"rest", "ws"}, "append runs: rest (concurrent POSTs), ws (prompts over WebSockets)")
	f.IntVar(&cfg.WSConns, "ws-conns", bench.DefaultWSConns, "WebSockets of the ws append run (each also receives every event)")
	f.IntVar(&cfg.WakeSamples, "wake-samples", bench.DefaultWakeSamples, "hibernated sessions woken one at a time")
	f.IntVar(&cfg.ActivationSessions, "activation-sessions", bench.DefaultActivationSessions, "hibernated sessions woken, 64 at a time, by the activation scenario")
	f.IntVar(&cfg.Sessions, "sessions", bench.DefaultSessions, "sessions hibernated by the memory scenario")
	f.IntVar(&cfg.ResumeEvents, "resume-events", bench.DefaultResumeEvents, "history length replayed by the resume scenario")
	f.StringVar(&cfg.PeerCentrifugo, "peer-centrifugo", "", "a Centrifugo v6 server (http://APIKEY@host:port): the resume scenario also replays the same history from it, the fan-out scenario also fans out through it")
	f.StringVar(&cfg.AgentBin, "agent-bin", "", "a scripted ACP agent program (go build ./actor/testdata/acpagent) for the agent scenario")
	f.IntVar(&cfg.AgentTurns, "agent-turns", bench.DefaultAgentTurns, "warm agent turns timed by the agent scenario")
	f.StringVar(&cfg.DataDir, "data", "", "directory for the servers' data (default: a temporary directory, removed afterwards)")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON instead of a table")
	f.BoolVar(&unsafe, "unsafe-no-sandbox", false, "run the benchmark harnesses (sleep, true) without bubblewrap")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run (server and clients) to this file")
	f.StringVar(&cfg.HeapProfile, "heapprofile", "", "the memory scenario writes the in-use heap with its hibernated sessions to this file (before them to FILE.before, after the first half of them to FILE.mid: go tool pprof -base FILE.mid FILE)")
	f.StringVar(&memProfile, "memprofile", "", "write an allocation profile of the whole run to this file (go tool pprof -sample_index=alloc_space)")
	f.BoolVarP(&verbose, "verbose", "v", false, "show the servers' debug logs")
	cmd.AddCommand(newBenchWatchersCmd(env))
	return cmd
}

func writeAllocProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create allocation profile: %w", err)
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return fmt.Errorf("write allocation profile: %w", err)
	}
	return f.Close()
}

// newBenchWatchersCmd is the hidden child process of the fan-out and memory
// scenarios: it holds the receivers so that the parent process measures only
// the server. It is driven by commands on stdin (see bench.RunWatchers).
func newBenchWatchersCmd(env *cliEnv) *cobra.Command {
	return &cobra.Command{
		Use:    "watchers",
		Short:  "Hold WebSocket and NATS receivers for the benchmarks (internal)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := bench.RaiseFileLimit(); err != nil {
				fmt.Fprintln(env.stderr, "bench watchers:", err)
			}
			return bench.RunWatchers(cmd.Context(), env.stdin, env.stdout)
		},
	}
}
