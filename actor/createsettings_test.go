package actor

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/session"
)

// TestHost_CreateWithSettings: settings given with PlaceCreate are checked
// before anything of the session exists (a refusal leaves no history file,
// catalog entry or lease) and, when accepted, are the new session's from its
// first event on.
func TestHost_CreateWithSettings(t *testing.T) {
	e := newEnv(t)
	d, setup := int64(2*time.Hour), "true"
	refused := session.NewID()
	rep := e.place("alice", session.PlaceRequest{Op: session.PlaceCreate, Session: refused, Title: "refused",
		Settings: &session.SettingsPatch{TurnTimeout: &d, Setup: &setup}})
	if rep.Error == nil || rep.Error.Code != session.CodeForbidden || !strings.Contains(rep.Error.Message, "turn_timeout") {
		t.Fatalf("create with a turn_timeout beyond the node's: %+v, want forbidden naming turn_timeout", rep)
	}
	entries, err := os.ReadDir(e.dir.Path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, de := range entries {
		if strings.Contains(de.Name(), string(refused)) {
			t.Errorf("a refused create left %s in the histories", de.Name())
		}
	}
	if _, err := e.kv.Get(context.Background(), string(refused)); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("a refused create's catalog entry: %v, want none", err)
	}
	for _, l := range e.host.Leases() {
		if l.Session == refused {
			t.Errorf("a refused create holds a lease")
		}
	}

	d = int64(5 * time.Minute)
	id := session.NewID()
	rep = e.place("alice", session.PlaceRequest{Op: session.PlaceCreate, Session: id, Title: "kept",
		Settings: &session.SettingsPatch{TurnTimeout: &d, Setup: &setup}})
	if rep.Error != nil || rep.Session == nil || rep.Session.Settings == nil {
		t.Fatalf("create with settings: %+v", rep)
	}
	if s := rep.Session.Settings; s.TurnTimeout != "5m0s" || s.Setup != "true" {
		t.Errorf("the created session's settings: %+v", s)
	}
	info := e.cmd(id, "alice", session.Command{Op: session.OpInfo})
	if info.Session == nil || info.Session.Settings == nil || info.Session.Settings.TurnTimeout != "5m0s" || info.Session.LastSeq != 1 {
		t.Errorf("info after create: %+v", info.Session)
	}
}
