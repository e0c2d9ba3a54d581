package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/gateway/client/clienttest"
	"github.com/atriumhq/atrium/session"
)

func TestClient_AuthConfig(t *testing.T) {
	want := clienttest.AuthConfig{Mode: "oidc", Issuer: "https://id.example.com", ClientID: "cli", ClientSecret: "public",
		Scopes: []string{"openid", "email"}, LoginURL: "/auth/login"}
	srv := clienttest.New(t, clienttest.Options{Auth: want})
	c := newClient(t, srv.URL, "alice")
	got, err := c.AuthConfig(testContext(t))
	if err != nil {
		t.Fatalf("AuthConfig: %v", err)
	}
	if got.Mode != client.AuthModeOIDC || got.Issuer != want.Issuer || got.ClientID != "cli" || got.ClientSecret != "public" ||
		strings.Join(got.Scopes, " ") != "openid email" || got.LoginURL != "/auth/login" {
		t.Fatalf("AuthConfig = %+v", got)
	}
	if auths := srv.Authorizations(); len(auths) != 0 {
		t.Fatalf("AuthConfig sent credentials: %q", auths)
	}

	dev, err := newClient(t, clienttest.New(t, clienttest.Options{}).URL, "alice").AuthConfig(testContext(t))
	if err != nil || dev.Mode != client.AuthModeDev {
		t.Fatalf("default AuthConfig = %+v, %v", dev, err)
	}
}

func TestClient_Whoami(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{Tenant: "acme", Admins: []string{"root"}})
	w, err := newClient(t, srv.URL, "alice").Whoami(testContext(t))
	if err != nil || w != (client.Whoami{User: "alice", Tenant: "acme", Via: "dev"}) {
		t.Fatalf("Whoami = %+v, %v", w, err)
	}
	if w, err := newClient(t, srv.URL, "root").Whoami(testContext(t)); err != nil || !w.Admin {
		t.Fatalf("admin Whoami = %+v, %v", w, err)
	}
	c := newClient(t, srv.URL, "alice")
	c.Token = "garbage"
	_, err = c.Whoami(testContext(t))
	var se *session.Error
	if !errors.As(err, &se) || se.Code != session.CodeUnauthenticated || !client.Terminal(err) {
		t.Fatalf("Whoami with a bad token = %v, want unauthenticated", err)
	}
}

func TestClient_Tokens(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{Tenant: "acme", Admins: []string{"root"}})
	alice := newClient(t, srv.URL, "alice")
	ctx := testContext(t)
	exp := time.Now().Add(48 * time.Hour).UTC().Truncate(time.Second)

	created, err := alice.CreateToken(ctx, client.TokenRequest{Name: "ci", ExpiresAt: exp, Role: session.RoleViewer})
	if err != nil {
		t.Fatalf("CreateToken: %v", err)
	}
	if !strings.HasPrefix(created.Token, "atr_"+created.Info.ID+"_") || created.Info.Name != "ci" || created.Info.User != "alice" ||
		created.Info.Tenant != "acme" || created.Info.Role != session.RoleViewer || !created.Info.ExpiresAt.Equal(exp) ||
		created.Info.CreatedAt.IsZero() {
		t.Fatalf("CreateToken = %+v", created)
	}
	if _, err := alice.CreateToken(ctx, client.TokenRequest{}); err == nil {
		t.Fatal("CreateToken without a name succeeded")
	}
	if _, err := alice.CreateToken(ctx, client.TokenRequest{Name: "x", Role: "god"}); err == nil {
		t.Fatal("CreateToken with role god succeeded")
	}

	// The token works as a bearer, capped at viewer.
	s := newSession(t, alice)
	bot, err := client.New(srv.URL, created.Token)
	if err != nil {
		t.Fatal(err)
	}
	bot.HTTP = alice.HTTP
	if w, err := bot.Whoami(ctx); err != nil || w.User != "alice" || w.Via != "token" || !w.ExpiresAt.Equal(exp) {
		t.Fatalf("Whoami with the token = %+v, %v", w, err)
	}
	if got, err := bot.GetSession(ctx, s.ID); err != nil || got.Role != session.RoleViewer {
		t.Fatalf("GetSession with a viewer token = %+v, %v", got, err)
	}
	if _, err := bot.Send(ctx, s.ID, "hi", ""); !isCode(err, session.CodeForbidden) {
		t.Fatalf("Send with a viewer token = %v, want forbidden", err)
	}

	other, err := newClient(t, srv.URL, "bob").CreateToken(ctx, client.TokenRequest{Name: "bob's"})
	if err != nil {
		t.Fatal(err)
	}
	list, err := alice.ListTokens(ctx, false)
	if err != nil || len(list) != 1 || list[0].ID != created.Info.ID || list[0].LastUsedAt.IsZero() {
		t.Fatalf("ListTokens = %+v, %v", list, err)
	}
	if _, err := alice.ListTokens(ctx, true); !isCode(err, session.CodeForbidden) {
		t.Fatalf("ListTokens(all) by a non-admin = %v, want forbidden", err)
	}
	all, err := newClient(t, srv.URL, "root").ListTokens(ctx, true)
	if err != nil || len(all) != 2 {
		t.Fatalf("ListTokens(all) by an admin = %+v, %v", all, err)
	}

	if err := alice.RevokeToken(ctx, other.Info.ID); !isCode(err, session.CodeNotFound) {
		t.Fatalf("RevokeToken of bob's token by alice = %v, want not found", err)
	}
	if err := alice.RevokeToken(ctx, created.Info.ID); err != nil {
		t.Fatalf("RevokeToken: %v", err)
	}
	if _, err := bot.Whoami(ctx); !isCode(err, session.CodeUnauthenticated) {
		t.Fatalf("Whoami with a revoked token = %v, want unauthenticated", err)
	}
	if err := alice.RevokeToken(ctx, created.Info.ID); !isCode(err, session.CodeNotFound) {
		t.Fatalf("RevokeToken twice = %v, want not found", err)
	}
	if err := newClient(t, srv.URL, "root").RevokeToken(ctx, other.Info.ID); err != nil {
		t.Fatalf("RevokeToken by an admin: %v", err)
	}
}

func TestClient_Audit(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{Tenant: "acme", Admins: []string{"root"}, AuditPageLimit: 4})
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 10 {
		actor := "alice"
		if i%2 == 1 {
			actor = "bob"
		}
		srv.AddAudit(clienttest.AuditEntry{Time: base.Add(time.Duration(i) * time.Hour), Tenant: "acme", Actor: actor,
			Action: "login", Outcome: "ok", Remote: "127.0.0.1", Detail: fmt.Sprint(i)})
	}
	srv.AddAudit(clienttest.AuditEntry{Time: base, Tenant: "other", Actor: "eve", Action: "login", Outcome: "ok"})
	root := newClient(t, srv.URL, "root")
	ctx := testContext(t)

	var details []string
	q := client.AuditQuery{Until: base.Add(100 * time.Hour)}
	for pages := 0; ; pages++ {
		page, err := root.Audit(ctx, q)
		if err != nil {
			t.Fatalf("Audit: %v", err)
		}
		if len(page.Entries) > 4 || pages > 5 {
			t.Fatalf("page %d has %d entries", pages, len(page.Entries))
		}
		for _, e := range page.Entries {
			details = append(details, e.Detail)
		}
		if page.Next == "" {
			break
		}
		q.Cursor = page.Next
	}
	if got := strings.Join(details, ","); got != "9,8,7,6,5,4,3,2,1,0" {
		t.Fatalf("audit details newest first = %s", got)
	}

	page, err := root.Audit(ctx, client.AuditQuery{Actor: "bob", Action: "login", Since: base.Add(3 * time.Hour),
		Until: base.Add(8 * time.Hour), Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range page.Entries {
		if e.Actor != "bob" || e.Tenant != "acme" || e.Outcome != client.AuditOK || e.Remote != "127.0.0.1" {
			t.Fatalf("filtered entry = %+v", e)
		}
		got = append(got, e.Detail)
	}
	if strings.Join(got, ",") != "7,5,3" {
		t.Fatalf("filtered entries = %v, want 7,5,3", got)
	}

	if _, err := newClient(t, srv.URL, "alice").Audit(ctx, client.AuditQuery{}); !isCode(err, session.CodeForbidden) {
		t.Fatalf("Audit by a non-admin = %v, want forbidden", err)
	}
	if _, err := root.Audit(ctx, client.AuditQuery{Cursor: "not-a-cursor"}); !isCode(err, session.CodeBadRequest) {
		t.Fatalf("Audit with a bad cursor = %v, want bad_request", err)
	}
}

// countingTokens hands out "dev:<user>" and counts calls.
type countingTokens struct {
	mu    sync.Mutex
	calls int    // guarded by mu
	user  string // guarded by mu
	err   error  // guarded by mu
}

func (c *countingTokens) Token(context.Context) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	return "dev:" + c.user, c.err
}

func (c *countingTokens) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

func (c *countingTokens) set(user string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.user, c.err = user, err
}

func TestClient_TokenSource(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL, "ignored")
	src := &countingTokens{user: "alice"}
	c.Tokens = src
	ctx := testContext(t)
	s := newSession(t, c)
	if s.Owner != "alice" {
		t.Fatalf("owner = %q: the token source was not used", s.Owner)
	}

	// Every WebSocket connection asks again: the reconnect after a drop
	// carries the new token.
	st, err := c.Watch(ctx, s.ID, 0, fastOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var w watched
	readUntil(t, st, &w, 1)
	src.set("alice", nil)
	n := len(srv.Authorizations())
	srv.DropConnections()
	appendN(srv, s.ID, 1)
	readUntil(t, st, &w, 2)
	if auths := srv.Authorizations()[n:]; len(auths) == 0 || auths[len(auths)-1] != "Bearer dev:alice" {
		t.Fatalf("reconnect sent %q", auths)
	}

	// A source that fails stops a request before anything is sent.
	n = len(srv.Authorizations())
	src.set("alice", session.Errorf(session.CodeUnauthenticated, "your login expired: run atrium login"))
	_, err = c.ListSessions(ctx)
	if !isCode(err, session.CodeUnauthenticated) || !strings.Contains(err.Error(), "your login expired") || !client.Terminal(err) {
		t.Fatalf("ListSessions with a failing token source = %v", err)
	}
	if len(srv.Authorizations()) != n {
		t.Fatal("a request was sent although the token source failed")
	}
	// The failure ends the stream at its next reconnect.
	srv.DropConnections()
	select {
	case <-st.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the stream kept reconnecting without a token")
	}
	if err := st.Err(); !isCode(err, session.CodeUnauthenticated) {
		t.Fatalf("stream ended with %v", err)
	}
	before := src.count()
	if before < 3 {
		t.Fatalf("token source called %d times", before)
	}

	// AuthConfig never asks for a token.
	if _, err := c.AuthConfig(ctx); err != nil {
		t.Fatal(err)
	}
	if src.count() != before {
		t.Fatal("AuthConfig asked the token source")
	}
}

func isCode(err error, code session.Code) bool {
	var se *session.Error
	return errors.As(err, &se) && se.Code == code
}
