// Package wiretest pins the bytes of the REST contract's JSON shapes.
package wiretest_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/gateway/dlq"
	"github.com/atriumhq/atrium/gateway/schedule"
	"github.com/atriumhq/atrium/gateway/task"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
)

var updateWire = flag.Bool("update-wire", false, "rewrite testdata/wire.golden")

// wireTime is a time with nanoseconds, as the server's are.
var wireTime = time.Date(2026, 11, 26, 1, 2, 3, 456789000, time.UTC)

// wireShape is one JSON shape of the REST contract, encoded as the server
// and as gateway/client encode it.
type wireShape struct {
	name string
	v    any
}

// wireShapes lists each REST shape in a full and an empty variant (the
// empty one pins what omitempty leaves out). Server and client forms of the
// same shape share a name prefix and must encode alike.
func wireShapes() []wireShape {
	exit := 3
	next := wireTime.Add(time.Hour)
	allow, deny := true, false
	title, secret := "renamed", "v"
	driver := session.RoleDriver
	atSeq := session.Seq(5)
	runFull := schedule.Run{Tick: wireTime, Missed: 2, Session: "s_1", Seq: 7, Turn: 3, Status: "ok", ExitCode: &exit,
		Error: "e", DeadLetter: "dl_1", Attempts: 2, StartedAt: wireTime, FinishedAt: wireTime}
	clientRun := client.ScheduleRun{Tick: wireTime, Missed: 2, Session: "s_1", Seq: 7, Turn: 3, Status: "ok", ExitCode: &exit,
		Error: "e", DeadLetter: "dl_1", Attempts: 2, StartedAt: wireTime, FinishedAt: wireTime}
	spec := schedule.Spec{Cron: "0 9 * * 1-5", TZ: "Europe/Paris", Session: "s_1", New: true, Title: "t", Prompt: "p", Missed: "run_once"}
	cspec := client.ScheduleSpec{Cron: "0 9 * * 1-5", TZ: "Europe/Paris", Session: "s_1", New: true, Title: "t", Prompt: "p", Missed: "run_once"}
	sched := schedule.Schedule{ID: "sc_1", Tenant: "acme", Creator: "ann", ScheduleSpec: spec, Paused: true, CreatedAt: wireTime,
		LastTick: wireTime, NextRun: &next, LastRun: &runFull}
	csched := client.Schedule{ID: "sc_1", Tenant: "acme", Creator: "ann", ScheduleSpec: cspec, Paused: true, CreatedAt: wireTime,
		LastTick: wireTime, NextRun: &next, LastRun: &clientRun}
	tokInfo := auth.TokenInfo{ID: "tk_1", Name: "ci", User: "ann", Tenant: "acme", Role: session.RoleDriver,
		CreatedAt: wireTime, ExpiresAt: wireTime, LastUsedAt: wireTime}
	ctokInfo := client.TokenInfo{ID: "tk_1", Name: "ci", User: "ann", Tenant: "acme", Role: session.RoleDriver,
		CreatedAt: wireTime, ExpiresAt: wireTime, LastUsedAt: wireTime}
	auditEntry := audit.Entry{ID: "a_1", Time: wireTime, Tenant: "acme", Actor: "ann", Via: "token", Action: "denied",
		Session: "s_1", Target: "bob", Outcome: "denied", Detail: "d", Remote: "127.0.0.1"}
	cauditEntry := client.AuditEntry{ID: "a_1", Time: wireTime, Tenant: "acme", Actor: "ann", Via: "token", Action: "denied",
		Session: "s_1", Target: "bob", Outcome: "denied", Detail: "d", Remote: "127.0.0.1"}
	dead := dlq.Entry{ID: "dl_1", Tenant: "acme", User: "ann", Kind: "task", Ref: "t_1", Reason: "r", Permanent: true,
		Attempts: 5, Payload: json.RawMessage(`{"task":"t_1"}`), FailedAt: wireTime}
	cdead := client.DeadLetter{ID: "dl_1", Tenant: "acme", User: "ann", Kind: "task", Ref: "t_1", Reason: "r", Permanent: true,
		Attempts: 5, Payload: json.RawMessage(`{"task":"t_1"}`), FailedAt: wireTime}
	tk := task.Task{ID: "t_1", Tenant: "acme", User: "ann", Repo: "o/r", Base: "main", Title: "fix", Session: "s_1",
		Branch: "atrium/t_1", Status: "pr_opened", Commit: "abc", PRURL: "https://x/pr/1", Error: "e", DeadLetter: "dl_1",
		CallbackURL: "https://cb", CreatedAt: wireTime, UpdatedAt: wireTime, Prompt: "secret prompt", Pushed: true, Turns: 2}
	ctk := client.Task{ID: "t_1", User: "ann", Repo: "o/r", Base: "main", Title: "fix", Session: "s_1",
		Branch: "atrium/t_1", Status: "pr_opened", Commit: "abc", PRURL: "https://x/pr/1", Error: "e", DeadLetter: "dl_1",
		CreatedAt: wireTime, UpdatedAt: wireTime}
	treq := task.Request{Repo: "o/r", Base: "main", Prompt: "p", Title: "t", Harness: session.Harness{Template: "shell"}, CallbackURL: "https://cb"}
	ctreq := client.TaskRequest{Repo: "o/r", Base: "main", Prompt: "p", Title: "t", Harness: session.Harness{Template: "shell"}, CallbackURL: "https://cb"}

	return []wireShape{
		// GET /v1/whoami (identity.go's answer; client.Whoami decodes it).
		{"whoami/server/full", api.Whoami{User: "ann", Tenant: "acme", Admin: true, Via: "token", ExpiresAt: wireTime}},
		{"whoami/server/empty", client.Whoami{User: "ann"}},
		// POST /v1/tokens: what the client sends.
		{"token_request/client/full", api.TokenRequest{Name: "ci", ExpiresAt: wireTime.Format(time.RFC3339Nano), Role: session.RoleViewer}},
		{"token_request/client/empty", api.TokenRequest{Name: "ci"}},
		{"token_info/server/full", tokInfo},
		{"token_info/server/empty", auth.TokenInfo{ID: "tk_1", CreatedAt: wireTime}},
		{"token_info/client/full", ctokInfo},
		{"new_token/server", api.NewToken{Token: "atr_tk_1_s", Info: tokInfo}},
		{"new_token/client", client.NewToken{Token: "atr_tk_1_s", Info: ctokInfo}},
		{"token_list/server", api.TokenList{Tokens: []auth.TokenInfo{tokInfo}}},
		{"audit_entry/server/full", auditEntry},
		{"audit_entry/server/empty", audit.Entry{ID: "a_1", Time: wireTime}},
		{"audit_entry/client/full", cauditEntry},
		{"audit_page/server", api.AuditPage{Entries: []audit.Entry{auditEntry}, Next: "c1"}},
		{"audit_page/client", client.AuditPage{Entries: []client.AuditEntry{cauditEntry}, Next: "c1"}},
		// Schedules.
		{"schedule_spec/server/full", spec},
		{"schedule_spec/server/empty", schedule.Spec{}},
		{"schedule_spec/client/full", cspec},
		{"schedule_spec/client/empty", client.ScheduleSpec{}},
		{"schedule/server/full", sched},
		{"schedule/server/empty", schedule.Schedule{}},
		{"schedule/client/full", csched},
		{"schedule/client/empty", client.Schedule{}},
		{"schedule_run/server/empty", schedule.Run{}},
		{"schedule_list/server", api.ScheduleList{Schedules: []schedule.Schedule{sched}}},
		// Dead letters.
		{"dead_letter/server/full", dead},
		{"dead_letter/client/full", cdead},
		{"dead_letter/server/empty", dlq.Entry{}},
		{"dead_letter_list/server", api.DeadLetterList{DeadLetters: []dlq.Entry{dead}}},
		// Tasks.
		{"task_request/server/full", treq},
		{"task_request/client/full", ctreq},
		{"task_request/client/empty", client.TaskRequest{}},
		{"task/server/full", tk.View()},
		{"task/server/empty", task.Task{}.View()},
		{"task/client/full", ctk},
		{"started_task/server", api.StartedTask{Task: "t_1", Session: "s_1", Branch: "atrium/t_1"}},
		{"started_task/client", client.StartedTask{Task: "t_1", Session: "s_1", Branch: "atrium/t_1"}},
		// Sessions.
		{"create_session/client/template", client.CreateRequest{Title: "t", Harness: session.Harness{Template: "shell"}, Egress: []string{"example.com"}}},
		{"create_session/client/command", client.CreateRequest{Harness: session.Harness{Command: []string{"sh", "-c", "x"}, Stdin: "text"}}},
		{"create_session/client/agent", client.CreateRequest{Harness: session.Harness{Agent: "claude", PermissionMode: "auto"}}},
		{"create_session/client/empty", client.CreateRequest{}},
		{"session_patch/client/full", api.SessionPatch{Title: &title, Settings: map[string]json.RawMessage{"permission_mode": json.RawMessage(`"auto"`), "turn_timeout": json.RawMessage(`"10m"`)}}},
		{"session_patch/client/empty", api.SessionPatch{}},
		{"fork/client/full", api.Fork{AtSeq: &atSeq, Title: "f"}},
		{"fork/client/empty", api.Fork{}},
		{"session_list/server", api.SessionList{Sessions: []session.Session{}}},
		{"message/client/full", api.Message{Text: "hi", ClientID: "c1"}},
		{"message/client/empty", api.Message{Text: "hi"}},
		{"approval/client", api.Approval{Allow: &deny}},
		{"approval/server/option", api.Approval{Allow: &allow, OptionID: "allow_once"}},
		{"member/client", api.MemberRequest{Role: &driver}},
		{"member/server", api.Member{User: "bob", Role: session.RoleDriver}},
		{"secret/client", api.SecretValue{Value: &secret}},
		{"secret_list/server", api.SecretList{Secrets: []session.SecretInfo{}}},
		{"egress/client", api.Egress{Allow: &[]string{}}},
		// A quota refusal (429), as gateway/invoke.go's refuse wrote it.
		{"quota_refusal/server", api.QuotaRefusal{Error: api.QuotaError{Code: session.CodeTooManyRequests, Message: "over",
			Quota: "turns_per_hour", Limit: 5, Scope: "tenant", RetryAfterS: 42}}},
		// GET /auth/config.
		{"auth_config/server/full", auth.ConfigInfo{Mode: "oidc", Issuer: "https://id", ClientID: "cli", ClientSecret: "s",
			Scopes: []string{"openid"}, LoginURL: "/auth/login", DevUser: "ann"}},
		{"auth_config/server/empty", auth.ConfigInfo{Mode: "tokens"}},
		{"auth_config/client/full", client.AuthConfig{Mode: "oidc", Issuer: "https://id", ClientID: "cli", ClientSecret: "s",
			Scopes: []string{"openid"}, LoginURL: "/auth/login"}},
		// POST /v1/sessions/{id}/invoke's events and its cancel body.
		{"invoke_start/server", api.InvokeStart{InvokeID: "inv_1", Session: "s_1", Seq: 7, Turn: 3}},
		{"invoke_text/server", api.InvokeText{Text: "out"}},
		{"invoke_exit/server", api.InvokeExit{ExitCode: 3, Status: session.TurnFailed, DurationMS: 1234}},
		{"invoke_cancel/server", api.InvokeCancel{InvokeID: "inv_1"}},
	}
}

// TestWire_Golden pins the bytes of each REST shape (DESIGN §7 is exact):
// moving a declaration must not change them.
func TestWire_Golden(t *testing.T) {
	var got bytes.Buffer
	for _, s := range wireShapes() {
		b, err := json.Marshal(s.v)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		fmt.Fprintf(&got, "%s\t%s\n", s.name, b)
	}
	path := filepath.Join("testdata", "wire.golden")
	if *updateWire {
		if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden (run with -update-wire once): %v", err)
	}
	wl, gl := strings.Split(string(want), "\n"), strings.Split(got.String(), "\n")
	for i := 0; i < max(len(wl), len(gl)); i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			t.Errorf("line %d:\n got %s\nwant %s", i+1, g, w)
		}
	}
}

// TestWire_ClientRequests checks that gateway/client's methods put on the
// wire the request bodies pinned in testdata/wire.golden: the SDK's Go-side
// inputs (CreateRequest, TokenRequest, ForkRequest, SessionPatch) are
// encoded through session/api's types.
func TestWire_ClientRequests(t *testing.T) {
	golden := map[string]string{}
	b, err := os.ReadFile(filepath.Join("testdata", "wire.golden"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		name, body, _ := strings.Cut(line, "\t")
		golden[name] = body
	}
	var got []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "{}\n")
	}))
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL, "dev:ann")
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	title := "renamed"
	for name, call := range map[string]func() error{
		"token_request/client/full": func() error {
			_, err := c.CreateToken(ctx, client.TokenRequest{Name: "ci", ExpiresAt: wireTime, Role: session.RoleViewer})
			return err
		},
		"token_request/client/empty": func() error { _, err := c.CreateToken(ctx, client.TokenRequest{Name: "ci"}); return err },
		"create_session/client/template": func() error {
			_, err := c.CreateSession(ctx, client.CreateRequest{Title: "t", Harness: session.Harness{Template: "shell"}, Egress: []string{"example.com"}})
			return err
		},
		"create_session/client/agent": func() error {
			_, err := c.CreateSession(ctx, client.CreateRequest{Harness: session.Harness{Agent: "claude", PermissionMode: "auto"}})
			return err
		},
		"session_patch/client/full": func() error {
			_, err := c.PatchSession(ctx, "s_1", client.SessionPatch{Title: &title, Settings: map[string]any{"permission_mode": "auto", "turn_timeout": "10m"}})
			return err
		},
		"fork/client/full":  func() error { _, err := c.Fork(ctx, "s_1", client.ForkRequest{AtSeq: 5, Title: "f"}); return err },
		"fork/client/empty": func() error { _, err := c.Fork(ctx, "s_1", client.ForkRequest{}); return err },
		"message/client/full": func() error {
			_, err := c.Send(ctx, "s_1", "hi", "c1")
			return err
		},
		"approval/client": func() error { return c.Approve(ctx, "s_1", "a1", false) },
		"member/client":   func() error { return c.SetMember(ctx, "s_1", "bob", session.RoleDriver) },
		"secret/client":   func() error { return c.SetSecret(ctx, "s_1", "KEY", "v") },
		"egress/client":   func() error { _, err := c.SetEgress(ctx, "s_1", nil); return err },
		"schedule_spec/client/full": func() error {
			_, err := c.CreateSchedule(ctx, client.ScheduleSpec{Cron: "0 9 * * 1-5", TZ: "Europe/Paris", Session: "s_1", New: true, Title: "t", Prompt: "p", Missed: "run_once"})
			return err
		},
		"task_request/client/full": func() error {
			_, err := c.StartTask(ctx, client.TaskRequest{Repo: "o/r", Base: "main", Prompt: "p", Title: "t", Harness: session.Harness{Template: "shell"}, CallbackURL: "https://cb"})
			return err
		},
	} {
		got = nil
		if err := call(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want, ok := golden[name]
		if !ok {
			t.Fatalf("%s: not in wire.golden", name)
		}
		if g := strings.TrimSpace(string(got)); g != want {
			t.Errorf("%s: the client sent\n %s\nwant\n %s", name, g, want)
		}
	}
}
