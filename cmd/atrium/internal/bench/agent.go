package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/atriumhq/atrium/session"
)

// AgentName is the name the agent scenario's scripted ACP agent is
// configured under (ServerOptions.AgentBin).
const AgentName = "bench-scripted"

// agentFirstDeltaTarget is DESIGN's goal for the node's overhead per turn.
const agentFirstDeltaTarget = 20 * time.Millisecond

// agentTurnWait bounds one scripted turn.
const agentTurnWait = 30 * time.Second

// agent measures, on a warm scripted ACP agent (Config.AgentBin, the
// protocol of actor/testdata/acpagent: a prompt "chunks N" answers in N
// message chunks), the time from a prompt's acknowledgement to the first
// delta frame reaching a WebSocket watcher, and the durable rows each turn
// writes as the streamed chunks grow: they must not grow with them.
func (r *runner) agent(ctx context.Context) (_ []Result, err error) {
	if r.cfg.AgentBin == "" {
		return nil, errors.New("the agent scenario needs a scripted ACP agent: --agent-bin (go build ./actor/testdata/acpagent)")
	}
	d, err := r.startServer(ctx, ScenarioAgent, time.Hour)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, d.close(ctx)) }()

	var s session.Session
	if err := d.c.do(ctx, http.MethodPost, "/v1/sessions", map[string]any{"title": "bench agent", "agent": AgentName}, &s); err != nil {
		return nil, fmt.Errorf("create agent session: %w", err)
	}
	w, err := d.c.dialWS(ctx, s.ID, 0)
	if err != nil {
		return nil, err
	}
	frames := make(chan []byte, 4096)
	var readErr error // set before frames closes
	go func() {
		readErr = w.readLoop(func(f []byte) { frames <- append([]byte(nil), f...) })
		close(frames)
	}()
	defer w.close()

	// turn prompts once and follows the watcher until the turn finishes:
	// the first delta's arrival and the durable events after the prompt.
	turnNo := int64(0)
	turn := func(text string) (firstDelta time.Duration, rows, deltas int, err error) {
		turnNo++
		seq, err := d.c.prompt(ctx, s.ID, promptBody(text))
		if err != nil {
			return 0, 0, 0, fmt.Errorf("prompt: %w", err)
		}
		acked := time.Now()
		lastErr := "no error event"
		timeout := time.NewTimer(agentTurnWait)
		defer timeout.Stop()
		for {
			select {
			case f, ok := <-frames:
				if !ok {
					return 0, 0, 0, fmt.Errorf("the watcher's connection ended: %v", readErr)
				}
				var fr struct {
					Type  string          `json:"type"`
					Event json.RawMessage `json:"event"`
				}
				if json.Unmarshal(f, &fr) != nil {
					continue
				}
				switch fr.Type {
				case session.FrameDelta:
					if deltas == 0 {
						firstDelta = time.Since(acked)
					}
					deltas++
				case session.FrameEvent:
					var ev struct {
						Seq  session.Seq  `json:"seq"`
						Kind session.Kind `json:"kind"`
						Data struct {
							Turn   int64  `json:"turn"`
							Status string `json:"status"`
						} `json:"data"`
					}
					if json.Unmarshal(fr.Event, &ev) != nil || ev.Seq <= seq {
						continue
					}
					rows++
					if ev.Kind == session.KindError {
						lastErr = string(fr.Event)
					}
					if ev.Kind == session.KindTurnFinished && ev.Data.Turn == turnNo {
						if ev.Data.Status != string(session.TurnOK) {
							return 0, 0, 0, fmt.Errorf("turn %d finished %s: %s", turnNo, ev.Data.Status, lastErr)
						}
						return firstDelta, rows, deltas, nil
					}
				}
			case <-timeout.C:
				return 0, 0, 0, fmt.Errorf("turn %d did not finish within %v", turnNo, agentTurnWait)
			case <-ctx.Done():
				return 0, 0, 0, ctx.Err()
			}
		}
	}
	// The first turn starts the agent (cold); the timed ones are warm.
	if _, _, _, err := turn("chunks 1"); err != nil {
		return nil, fmt.Errorf("warm-up turn: %w", err)
	}
	n := r.cfg.AgentTurns
	r.progress("agent: %d warm turns, prompt ack → first delta at a watcher", n)
	h := NewHistogram()
	for i := range n {
		fd, _, deltas, err := turn("chunks 1")
		if err != nil {
			return nil, err
		}
		if deltas == 0 {
			return nil, fmt.Errorf("turn %d: no delta reached the watcher", i+2)
		}
		h.Record(fd)
	}
	row := latencyRow(Result{Scenario: ScenarioAgent, Measure: "prompt ack → first delta at a watcher (warm agent)", Unit: "ms", Target: "p50 < 20 ms"}, h)
	row.Value = row.Median
	row.Met = met(h.Quantile(0.5) < agentFirstDeltaTarget)
	res := []Result{row}
	r.progress("agent: first delta p50 %s p99 %s", fmtMS(row.Median), fmtMS(row.P99))

	// The rows are counted from the history (REST), not the watcher: a
	// burst of thousands of chunks from the scripted agent, all at once,
	// can outrun a watcher's send queue (gateway.DefaultSendQueue) on a
	// loaded machine and close it as a slow consumer.
	w.close()
	var first int
	for i, chunks := range []int{1, 100, 2000} {
		rows, err := r.agentRows(ctx, d.c, s.ID, turnNo+1, chunks)
		if err != nil {
			return res, err
		}
		turnNo++
		if i == 0 {
			first = rows
		}
		row := Result{Scenario: ScenarioAgent, Measure: fmt.Sprintf("durable rows per turn, %d chunks streamed", chunks), Unit: "rows", Value: float64(rows),
			Target: "same as 1 chunk", Met: met(rows == first)}
		res = append(res, row)
		r.progress("agent: %d chunks: %d durable rows", chunks, rows)
	}
	return res, nil
}

// agentRows prompts "chunks N" as turn n and returns the durable events
// the turn wrote after its prompt, read from the history once it finished.
func (r *runner) agentRows(ctx context.Context, c *client, id session.ID, n int64, chunks int) (int, error) {
	seq, err := c.prompt(ctx, id, promptBody(fmt.Sprintf("chunks %d", chunks)))
	if err != nil {
		return 0, fmt.Errorf("prompt: %w", err)
	}
	deadline := time.Now().Add(agentTurnWait)
	for {
		var page session.EventsPage
		if err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/sessions/%s/events?after=%d", id, seq), nil, &page); err != nil {
			return 0, fmt.Errorf("read the history: %w", err)
		}
		for i, raw := range page.Events {
			var ev struct {
				Kind session.Kind `json:"kind"`
				Data struct {
					Turn   int64  `json:"turn"`
					Status string `json:"status"`
				} `json:"data"`
			}
			if err := json.Unmarshal(raw, &ev); err != nil {
				return 0, fmt.Errorf("decode event: %w", err)
			}
			if ev.Kind == session.KindTurnFinished && ev.Data.Turn == n {
				if ev.Data.Status != string(session.TurnOK) {
					return 0, fmt.Errorf("turn %d (%d chunks) finished %s", n, chunks, ev.Data.Status)
				}
				return i + 1, nil
			}
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("turn %d (%d chunks) did not finish within %v", n, chunks, agentTurnWait)
		}
		sleepCtx(ctx, 20*time.Millisecond) // Polling interval.
		if err := ctx.Err(); err != nil {
			return 0, err
		}
	}
}

// installAgentBin copies the scripted agent program src to dst, the layout
// of an installed agent (compute/agents).
func installAgentBin(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("read the scripted agent: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("install the scripted agent: %w", err)
	}
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		return fmt.Errorf("install the scripted agent: %w", err)
	}
	return nil
}
