package client_test

import (
	"context"
	"testing"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
)

// TestE2E_Typing: Stream.Typing(true) from a driver shows as "typing" on
// the driver's watcher in the presence frames the owner's stream gets;
// Typing(false) clears it at once (before the gateway's TTL).
func TestE2E_Typing(t *testing.T) {
	stk := startStack(t)
	ctx := e2eContext(t)
	alice := newCuttable(t, stk.URL, "alice")
	bob := newCuttable(t, stk.URL, "bob")
	s, err := alice.CreateSession(ctx, client.CreateRequest{Title: "typing"})
	if err != nil {
		t.Fatal(err)
	}
	if err := alice.SetMember(ctx, s.ID, "bob", session.RoleDriver); err != nil {
		t.Fatal(err)
	}
	ast, err := alice.Watch(ctx, s.ID, 0, fastOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer ast.Close()
	bst, err := bob.Watch(ctx, s.ID, 0, fastOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer bst.Close()
	// bobTyping reads alice's frames until a presence frame lists bob
	// with typing as want.
	bobTyping := func(ctx context.Context, want bool) {
		t.Helper()
		for {
			f, err := ast.Next(ctx)
			if err != nil {
				t.Fatalf("waiting for bob typing=%v: %v", want, err)
			}
			if f.Presence == nil {
				continue
			}
			for _, w := range f.Presence.Watchers {
				if w.User == "bob" && w.Typing == want {
					return
				}
			}
		}
	}
	bobTyping(ctx, false) // bob is watching, not typing
	if err := bst.Typing(ctx, true); err != nil {
		t.Fatal(err)
	}
	bobTyping(ctx, true)
	// Well within the typing TTL (6 s): only the stop frame clears it.
	stopCtx, cancel := context.WithTimeout(ctx, gateway.DefaultTypingTTL/2)
	defer cancel()
	if err := bst.Typing(stopCtx, false); err != nil {
		t.Fatal(err)
	}
	bobTyping(stopCtx, false)
}
