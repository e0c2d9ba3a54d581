package actor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"syscall"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
)

// The setup step (settings.setup, issue 17 item 5): a session's setup
// command (e.g. `pip install -r requirements.txt`) runs in /workspace before
// a turn when the sandbox is new, when files were written into the
// workspace (a files_changed event) since it last succeeded, or when the
// command changed. Its output goes out as output events of the turn with
// stream "setup"; its failure fails the turn with the reason, and the next
// turn runs it again.

// setupStream is the output stream of the setup command's events.
const setupStream = "setup"

// setupStep is the session's setup command, set on its box by its actor
// before each turn.
type setupStep struct {
	cmd  string
	hist History // read for the last files_changed; kept open while the turn runs
}

// setupMark is what the last successful setup ran for.
type setupMark struct {
	cmd   string
	born  time.Time   // the sandbox it ran in
	files session.Seq // the last files_changed before it
}

// setupStep returns the session's setup step; nil without a setup command.
func (s *sessionActor) setupStep() *setupStep {
	if s.events.meta.Setup == "" {
		return nil
	}
	return &setupStep{cmd: s.events.meta.Setup, hist: s.hist}
}

// runSetup runs the box's setup command if it is due; nil means the turn
// goes on, anything else is how the turn ends.
func (r *runner) runSetup() *turnExited {
	b := r.box
	if r.agent == nil && b.agent != nil {
		// The session runs a harness now (settings.harness): the agent
		// it ran before stops.
		b.agent.stale = true
		b.agent.kill()
		b.agent = nil
	}
	st := b.setup
	if st == nil || b.sb == nil {
		return nil
	}
	files, err := lastFilesChanged(r.ctx, st.hist)
	if err != nil {
		r.log.Warn("read the last files_changed for the setup step", "err", err)
	}
	want := setupMark{cmd: st.cmd, born: b.born, files: files}
	if b.setupDone == want {
		return nil
	}
	start := time.Now()
	proc, err := b.sb.Exec(r.ctx, compute.ExecRequest{Argv: []string{"bash", "-lc", "exec 2>&1\n" + st.cmd}, Dir: agentCwd,
		Env: []string{session.EnvSession + "=" + string(r.id), session.EnvTurn + "=" + fmt.Sprint(r.turn)}})
	if err != nil {
		if sandboxGone(err) {
			return r.lost("the sandbox is gone: " + err.Error() + "; the next turn gets a fresh sandbox with the last saved workspace")
		}
		return setupFailed("the setup command (settings.setup) could not be started: " + err.Error())
	}
	b.dirty = true
	out := make(chan []byte, 1)
	r.wg.Go(func() { readChunks(proc.Stdout(), out) })
	r.wg.Go(func() { _, _ = io.Copy(io.Discard, proc.Stderr()) })
	_ = proc.Stdin().Close()
	timeout := time.NewTimer(r.timeout)
	defer timeout.Stop()
	var stop *stopRequest
	var tail []byte
	end := func(req stopRequest) {
		if stop == nil {
			stop = &req
			_ = proc.Signal(syscall.SIGKILL)
		}
	}
	for out != nil {
		select {
		case chunk, ok := <-out:
			if !ok {
				out = nil
				continue
			}
			tail = append(tail, chunk...)
			if len(tail) > stderrTail {
				tail = tail[len(tail)-stderrTail:]
			}
			if stop == nil {
				r.emitSetup(chunk, end)
			}
		case req := <-r.stops:
			end(req)
		case <-timeout.C:
			end(stopRequest{status: session.TurnTimeout})
		case <-r.ctx.Done():
			end(stopRequest{status: session.TurnCancelled})
		}
	}
	exit, err := proc.Wait()
	switch {
	case stop != nil:
		return r.stoppedBeforeStart(*stop)
	case err != nil:
		return setupFailed("the setup command (settings.setup) could not be waited for: " + err.Error())
	case exit.Lost:
		return r.lost("the sandbox was lost during the setup command: " + exit.Detail)
	case exit.Code != 0 || exit.Signal != 0:
		msg := fmt.Sprintf("the setup command (settings.setup) failed (%s)", exitDetail(exit))
		if t := strings.TrimSpace(strings.ToValidUTF8(string(tail), "?")); t != "" {
			msg += "; its output ends with: " + t
		}
		return setupFailed(msg + "; the next turn runs it again")
	}
	r.log.Info("setup command done", "turn", r.turn, "duration", time.Since(start))
	b.setupDone = want
	return nil
}

// emitSetup sends a chunk of the setup command's output as output events
// once a credit is free; a stop request that comes meanwhile goes to end.
func (r *runner) emitSetup(chunk []byte, end func(stopRequest)) {
	text := strings.ToValidUTF8(string(chunk), "\uFFFD")
	for len(text) > 0 {
		n := min(len(text), session.MaxOutputEventBytes)
		for n < len(text) && n > 0 && (text[n]&0xC0) == 0x80 {
			n--
		}
		select {
		case <-r.credits:
		case req := <-r.stops:
			end(req)
			return
		case <-r.ctx.Done():
			return
		}
		r.send(&turnEvent{r: r, kind: session.KindOutput, data: mustMarshal(session.OutputData{Turn: r.turn, Stream: setupStream, Text: text[:n]})})
		text = text[n:]
	}
}

// exitDetail says how a command ended.
func exitDetail(e compute.Exit) string {
	if e.Detail != "" {
		return e.Detail
	}
	return fmt.Sprintf("exit code %d", e.Code)
}

func setupFailed(msg string) *turnExited {
	return &turnExited{status: session.TurnFailed, code: -1, reason: msg, errors: []session.ErrorData{{Code: session.CodeBadRequest, Message: msg}}}
}

// lastFilesChanged returns the seq of the session's last files_changed
// event, 0 if none.
func lastFilesChanged(ctx context.Context, hist History) (session.Seq, error) {
	if hist == nil {
		return 0, nil
	}
	raw, err := hist.LastOfKind(ctx, session.KindFilesChanged)
	if err != nil || raw == nil {
		return 0, err
	}
	var ev struct {
		Seq session.Seq `json:"seq"`
	}
	if err := json.Unmarshal(raw, &ev); err != nil {
		return 0, err
	}
	return ev.Seq, nil
}
