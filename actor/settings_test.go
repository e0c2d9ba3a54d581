package actor

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

// TestHost_Settings: the owner renames a session and changes its agent's
// permission mode; the title is in the reply and the catalog at once, and
// after the node restarts (the agent's next start) the agent is launched
// in the new mode. Drivers are refused, bad values are named.
func TestHost_Settings(t *testing.T) {
	agents := &fakeAgents{dir: buildFakeAgent(t)}
	e := newEnv(t, withAgents(agents, &fakeModels{}))
	id := e.create("alice", session.Harness{Agent: "fake", PermissionMode: session.PermissionAuto})
	e.cmd(id, "alice", session.Command{Op: session.OpMember, User: "bob", Role: session.RoleDriver})
	w := e.watch(id)
	if fin := agentRun(t, e, w, id, 1, "chunks 1"); fin.Status != session.TurnOK {
		t.Fatalf("turn 1: %+v", fin)
	}
	if got := agents.lastMode.Load(); got == nil || *got != session.PermissionAuto {
		t.Fatalf("turn 1 launched in mode %v, want auto", got)
	}
	str := func(s string) *string { return &s }

	rep := e.cmd(id, "bob", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{Title: str("mine")}})
	wantCode(t, "driver", rep, session.CodeForbidden, "")
	rep = e.cmd(id, "alice", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{PermissionMode: str("yolo")}})
	wantCode(t, "yolo", rep, session.CodeBadRequest, `not "yolo"`)
	rep = e.cmd(id, "alice", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{Title: str(strings.Repeat("t", session.MaxTitleBytes+1))}})
	wantCode(t, "long title", rep, session.CodeBadRequest, "title is longer than")
	rep = e.cmd(id, "alice", session.Command{Op: session.OpSettings})
	wantCode(t, "empty", rep, session.CodeBadRequest, "")

	plain := e.create("alice", session.Harness{})
	rep = e.cmd(plain, "alice", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{PermissionMode: str("ask")}})
	wantCode(t, "not an agent session", rep, session.CodeBadRequest, "permission_mode is for agent sessions")

	rep = e.cmd(id, "alice", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{Title: str("Renamed"), PermissionMode: str(session.PermissionAsk)}})
	if rep.Error != nil || rep.Session == nil || rep.Session.Title != "Renamed" {
		t.Fatalf("settings: %+v", rep)
	}
	if c, ok := e.catalog(id); !ok || c.Title != "Renamed" {
		t.Fatalf("catalog after the reply: %+v %v, want title Renamed", c, ok)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.host.Close(ctx); err != nil {
		t.Fatal(err)
	}
	e.start()
	if fin := agentRun(t, e, w, id, 2, "chunks 1"); fin.Status != session.TurnOK {
		t.Fatalf("turn 2: %+v", fin)
	}
	if got := agents.lastMode.Load(); got == nil || *got != session.PermissionAsk {
		t.Fatalf("after the restart launched in mode %v, want ask", got)
	}
	if info := e.cmd(id, "bob", session.Command{Op: session.OpInfo}); info.Session == nil || info.Session.Title != "Renamed" {
		t.Fatalf("info after restart: %+v", info)
	}
}

// TestHost_SettingsTurnTimeout: a session's own turn_timeout, within the
// node's, stops its next turn with status timeout; beyond the node's it is
// forbidden, naming the limit.
func TestHost_SettingsTurnTimeout(t *testing.T) {
	e := newEnv(t, withGrace(100*time.Millisecond), func(c *Config) { c.TurnTimeout = time.Minute })
	id := e.create("alice", shell())
	d := func(v time.Duration) *int64 { n := int64(v); return &n }
	rep := e.cmd(id, "alice", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{TurnTimeout: d(2 * time.Minute)}})
	wantCode(t, "beyond", rep, session.CodeForbidden, "beyond this server's limit of 1m0s (node.turn_timeout)")
	rep = e.cmd(id, "alice", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{TurnTimeout: d(-1)}})
	wantCode(t, "negative", rep, session.CodeBadRequest, "must be positive")
	rep = e.cmd(id, "alice", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{TurnTimeout: d(300 * time.Millisecond)}})
	if rep.Error != nil {
		t.Fatalf("set turn_timeout: %+v", rep.Error)
	}
	w := e.watch(id)
	e.prompt(id, "alice", "trap '' TERM; while :; do sleep 0.05; done")
	if fin := data[session.TurnFinishedData](t, w.until("turn_finished", finished(1))); fin.Status != session.TurnTimeout {
		t.Errorf("status = %s, want timeout", fin.Status)
	}
}
