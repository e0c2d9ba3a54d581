package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/gateway/client/clienttest"
	"github.com/atriumhq/atrium/session"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newClient returns a client of server acting as user, with its own
// transport so no connection outlives the test.
func newClient(tb testing.TB, server, user string) *client.Client {
	tb.Helper()
	c, err := client.New(server, "dev:"+user)
	if err != nil {
		tb.Fatalf("client.New: %v", err)
	}
	tr := &http.Transport{}
	c.HTTP = &http.Client{Transport: tr}
	tb.Cleanup(tr.CloseIdleConnections)
	return c
}

func testContext(tb testing.TB) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

func TestNew(t *testing.T) {
	for name, tc := range map[string]struct {
		in, want string
		ok       bool
	}{
		"http":          {"http://127.0.0.1:7080", "http://127.0.0.1:7080", true},
		"https prefix":  {"https://atrium.example.com/base/", "https://atrium.example.com/base", true},
		"no scheme":     {"127.0.0.1:7080", "", false},
		"ws scheme":     {"ws://host", "", false},
		"no host":       {"http://", "", false},
		"query":         {"http://host/?a=b", "", false},
		"garbage":       {"http://[::1", "", false},
		"trailing path": {"http://host/", "http://host", true},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := client.New(tc.in, "tok")
			if tc.ok != (err == nil) {
				t.Fatalf("New(%q) error = %v, want ok=%v", tc.in, err, tc.ok)
			}
			if tc.ok && c.Server != tc.want {
				t.Errorf("Server = %q, want %q", c.Server, tc.want)
			}
		})
	}
}

func TestCreateRequest_MarshalJSON(t *testing.T) {
	for name, tc := range map[string]struct {
		req  client.CreateRequest
		want string
	}{
		"empty":    {client.CreateRequest{}, `{}`},
		"title":    {client.CreateRequest{Title: "t"}, `{"title":"t"}`},
		"template": {client.CreateRequest{Harness: session.Harness{Template: "shell"}}, `{"harness":"shell"}`},
		"command":  {client.CreateRequest{Title: "x", Harness: session.Harness{Command: []string{"sh", "-c", "cat"}}}, `{"title":"x","harness":{"command":["sh","-c","cat"]}}`},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := json.Marshal(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Errorf("got %s, want %s", b, tc.want)
			}
		})
	}
	if _, err := json.Marshal(client.CreateRequest{Harness: session.Harness{Template: "a", Command: []string{"b"}}}); err == nil {
		t.Error("template and command together encoded without error")
	}
}

func TestClient_REST(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	ctx := testContext(t)
	alice := newClient(t, srv.URL, "alice")
	bob := newClient(t, srv.URL, "bob")

	s, err := alice.CreateSession(ctx, client.CreateRequest{Title: "demo", Harness: session.Harness{Command: []string{"cat"}}})
	if err != nil {
		t.Fatalf("CreateSession: %v", err)
	}
	if s.ID == "" || s.Title != "demo" || s.Owner != "alice" || s.Role != session.RoleOwner || s.LastSeq != 1 || s.Epoch == "" {
		t.Fatalf("created session = %+v", s)
	}
	if got := srv.Authorizations(); len(got) == 0 || got[len(got)-1] != "Bearer dev:alice" {
		t.Errorf("Authorization headers = %q, want Bearer dev:alice", got)
	}

	list, err := alice.ListSessions(ctx)
	if err != nil || len(list) != 1 || list[0].ID != s.ID {
		t.Fatalf("ListSessions = %+v, %v; want the one session", list, err)
	}
	if list, err := bob.ListSessions(ctx); err != nil || len(list) != 0 {
		t.Fatalf("bob's ListSessions = %+v, %v; want none", list, err)
	}
	if _, err := bob.GetSession(ctx, s.ID); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("bob GetSession error = %v, want not_found", err)
	}

	seq, err := alice.Send(ctx, s.ID, "hello", "c1")
	if err != nil || seq != 2 {
		t.Fatalf("Send = %d, %v; want seq 2", seq, err)
	}
	// The echo harness finishes the turn: wait for turn_finished by paging.
	waitFor(t, func() bool { return srv.LastSeq(s.ID) >= 5 })

	page, err := alice.Events(ctx, s.ID, 0, 2)
	if err != nil {
		t.Fatalf("Events: %v", err)
	}
	if len(page.Events) != 2 || page.Events[0].Seq != 1 || page.Events[1].Seq != 2 || page.LastSeq != 5 || page.Epoch != s.Epoch {
		t.Fatalf("page = %+v", page)
	}
	if page.Events[1].Kind != session.KindMessage || string(page.Raw[1]) == "" {
		t.Fatalf("event 2 = %+v raw %s", page.Events[1], page.Raw[1])
	}
	var md session.MessageData
	if err := json.Unmarshal(page.Events[1].Data, &md); err != nil || md.Text != "hello" || md.ClientID != "c1" {
		t.Fatalf("message data = %+v, %v", md, err)
	}
	var again session.Event
	if err := json.Unmarshal(page.Raw[1], &again); err != nil || again.Seq != 2 {
		t.Fatalf("raw event 2 = %s", page.Raw[1])
	}
	rest, err := alice.Events(ctx, s.ID, 2, 0)
	if err != nil || len(rest.Events) != 3 || rest.Events[0].Seq != 3 {
		t.Fatalf("Events after 2 = %+v, %v", rest, err)
	}

	if err := alice.Cancel(ctx, s.ID); !errors.Is(err, session.ErrConflict) {
		t.Fatalf("Cancel with nothing running = %v, want conflict", err)
	}
	if err := alice.Approve(ctx, s.ID, "nope", true); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("Approve unknown = %v, want not_found", err)
	}

	if err := bob.Cancel(ctx, s.ID); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("bob Cancel = %v, want not_found", err)
	}
	if err := alice.SetMember(ctx, s.ID, "bob", session.RoleViewer); err != nil {
		t.Fatalf("SetMember viewer: %v", err)
	}
	got, err := bob.GetSession(ctx, s.ID)
	if err != nil || got.Role != session.RoleViewer {
		t.Fatalf("bob GetSession = %+v, %v; want viewer", got, err)
	}
	var se *session.Error
	if _, err := bob.Send(ctx, s.ID, "hi", ""); !errors.As(err, &se) || se.Code != session.CodeForbidden || se.Message == "" {
		t.Fatalf("viewer Send = %v, want forbidden with the server's message", err)
	}
	if err := alice.SetMember(ctx, s.ID, "bob", session.RoleNone); err != nil {
		t.Fatalf("SetMember none: %v", err)
	}
	if _, err := bob.GetSession(ctx, s.ID); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("removed bob GetSession = %v, want not_found", err)
	}

	if err := alice.DeleteSession(ctx, s.ID); err != nil {
		t.Fatalf("DeleteSession: %v", err)
	}
	if _, err := alice.GetSession(ctx, s.ID); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("GetSession after delete = %v, want not_found", err)
	}
}

func TestClient_LocalValidation(t *testing.T) {
	// No server: these must fail before any request is made.
	c := newClient(t, "http://127.0.0.1:1", "alice")
	ctx := testContext(t)
	if _, err := c.GetSession(ctx, "bad/id"); !errors.Is(err, session.ErrBadRequest) {
		t.Errorf("GetSession(bad/id) = %v, want bad_request", err)
	}
	if _, err := c.Send(ctx, "s_1", strings.Repeat("x", session.MaxTextBytes+1), ""); !errors.Is(err, session.ErrPayloadTooLarge) {
		t.Errorf("Send(huge) = %v, want payload_too_large", err)
	}
	if err := c.SetMember(ctx, "s_1", " bob", session.RoleViewer); !errors.Is(err, session.ErrBadRequest) {
		t.Errorf("SetMember(' bob') = %v, want bad_request", err)
	}
	if err := c.Approve(ctx, "s_1", "", true); !errors.Is(err, session.ErrBadRequest) {
		t.Errorf("Approve('') = %v, want bad_request", err)
	}
}

func TestClient_ErrorDecoding(t *testing.T) {
	for name, tc := range map[string]struct {
		status   int
		body     string
		code     session.Code
		message  string
		terminal bool
	}{
		"contract body":   {404, `{"error":{"code":"not_found","message":"session s_1 not found"}}`, session.CodeNotFound, "session s_1 not found", true},
		"forbidden":       {403, `{"error":{"code":"forbidden","message":"this needs the driver role"}}`, session.CodeForbidden, "this needs the driver role", true},
		"busy":            {429, `{"error":{"code":"too_many_requests","message":"slow down"}}`, session.CodeTooManyRequests, "slow down", false},
		"empty message":   {409, `{"error":{"code":"conflict"}}`, session.CodeConflict, "conflict", true},
		"proxy html":      {502, `<html><body>Bad Gateway</body></html>`, session.CodeUnavailable, "server answered 502 Bad Gateway", false},
		"plain 401":       {401, ``, session.CodeUnauthenticated, "server answered 401 Unauthorized", true},
		"plain text 500":  {500, "boom\n", session.CodeInternal, "server answered 500 Internal Server Error: boom", false},
		"json not ours":   {400, `{"message":"nope"}`, session.CodeBadRequest, `server answered 400 Bad Request: {"message":"nope"}`, true},
		"unknown status ": {418, ``, session.CodeInternal, "server answered 418 I'm a teapot", false},
	} {
		t.Run(name, func(t *testing.T) {
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			}))
			defer hs.Close()
			c := newClient(t, hs.URL, "alice")
			_, err := c.GetSession(testContext(t), "s_1")
			var se *session.Error
			if !errors.As(err, &se) {
				t.Fatalf("error %v (%T) is not a *session.Error", err, err)
			}
			if se.Code != tc.code || se.Message != tc.message {
				t.Errorf("error = %q/%q, want %q/%q", se.Code, se.Message, tc.code, tc.message)
			}
			if !errors.Is(err, &session.Error{Code: tc.code}) {
				t.Errorf("errors.Is(%v, code %s) = false", err, tc.code)
			}
			if client.Terminal(err) != tc.terminal {
				t.Errorf("Terminal(%v) = %v, want %v", err, !tc.terminal, tc.terminal)
			}
		})
	}
}

func TestClient_ConnectionRefused(t *testing.T) {
	hs := httptest.NewServer(http.NotFoundHandler())
	url := hs.URL
	hs.Close()
	c := newClient(t, url, "alice")
	_, err := c.ListSessions(testContext(t))
	if err == nil {
		t.Fatal("ListSessions against a closed port succeeded")
	}
	var se *session.Error
	if errors.As(err, &se) || client.Terminal(err) {
		t.Errorf("network error %v became a protocol error", err)
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(tb testing.TB, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
