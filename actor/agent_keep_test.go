package actor

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/local"
	"github.com/atriumhq/atrium/session"
)

// keepingProvider is a local provider whose sleep keeps the sandbox's
// processes, as a VM host's does (it pauses the VM and saves it): Sleep
// leaves everything running. With lose set, Sleep stops every command
// instead, as when the VM could not be woken and was replaced.
type keepingProvider struct {
	*local.Provider
	sleeps atomic.Int32
	lose   atomic.Bool
}

func (p *keepingProvider) SleepKeepsProcesses() bool { return true }

func (p *keepingProvider) Open(ctx context.Context, spec compute.Spec) (compute.Sandbox, error) {
	sb, err := p.Provider.Open(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &keepingSandbox{Sandbox: sb, p: p}, nil
}

type keepingSandbox struct {
	compute.Sandbox
	p *keepingProvider
}

func (s *keepingSandbox) Sleep(ctx context.Context) error {
	s.p.sleeps.Add(1)
	if s.p.lose.Load() {
		return s.Sandbox.Sleep(ctx)
	}
	return nil
}

// With a provider whose sleep keeps processes, the agent process sleeps
// with its sandbox and serves the next prompt (no new process, no
// session/load, no re-hydration); when it did not survive, a new one
// loads the session.
func TestAgent_KeptOverSleep(t *testing.T) {
	agents := &fakeAgents{dir: buildFakeAgent(t), load: true}
	kp := &keepingProvider{Provider: newLocal(t, 0)}
	e := newEnv(t, withAgents(agents, nil), func(c *Config) {
		c.Provider = kp
		c.SandboxSleepAfter = 300 * time.Millisecond
	})
	id := e.create("alice", agentSession())
	w := e.watch(id)
	asleep := func() {
		t.Helper()
		w.until("sandbox sleeping", func(ev session.Event) bool {
			return ev.Kind == session.KindSandbox && data[session.SandboxData](t, ev).State == session.SandboxSleeping
		})
	}
	agentRun(t, e, w, id, 1, "first")
	asleep()
	if fin := agentRun(t, e, w, id, 2, "recall"); fin.Status != session.TurnOK {
		t.Fatalf("turn 2 after the sleep: %+v", fin)
	}
	if got := lastMessage(t, turnEvents(t, w, 2)); !strings.Contains(got, "known: first;") || !strings.HasSuffix(got, "transcript: ") {
		t.Errorf("turn 2 after the sleep said %q, want the same session, not re-hydrated", got)
	}
	if n := agents.launches.Load(); n != 1 || kp.sleeps.Load() != 1 {
		t.Errorf("launches = %d, sleeps = %d after a sleep that kept processes; want the same process (1 launch) and 1 sleep", n, kp.sleeps.Load())
	}
	if evs := turnEvents(t, w, 2); kinds(evs) != "agent_message" {
		// Nothing but the answer: no error event (a failed step).
		t.Errorf("turn 2's events: %s, want only the answer", summarize(evs))
	}

	// The process does not survive the next sleep: a new one loads the
	// session.
	kp.lose.Store(true)
	asleep()
	if fin := agentRun(t, e, w, id, 3, "recall"); fin.Status != session.TurnOK {
		t.Fatalf("turn 3 after a sleep that lost the process: %+v", fin)
	}
	if got := lastMessage(t, turnEvents(t, w, 3)); !strings.Contains(got, "known: first,recall;") || !strings.HasSuffix(got, "transcript: ") {
		t.Errorf("turn 3 said %q, want the session loaded by a new process", got)
	}
	if n := agents.launches.Load(); n != 2 {
		t.Errorf("launches = %d after the process was lost over the sleep, want 2", n)
	}
}
