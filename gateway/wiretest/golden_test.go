// Package wiretest pins the bytes of the REST contract's JSON shapes.
package wiretest_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
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
	allow := true
	title := "renamed"
	runFull := schedule.Run{Tick: wireTime, Missed: 2, Session: "s_1", Seq: 7, Turn: 3, Status: "ok", ExitCode: &exit,
		Error: "e", DeadLetter: "dl_1", Attempts: 2, StartedAt: wireTime, FinishedAt: wireTime}
	clientRun := client.ScheduleRun{Tick: wireTime, Missed: 2, Session: "s_1", Seq: 7, Turn: 3, Status: "ok", ExitCode: &exit,
		Error: "e", DeadLetter: "dl_1", Attempts: 2, StartedAt: wireTime, FinishedAt: wireTime}
	spec := schedule.Spec{Cron: "0 9 * * 1-5", TZ: "Europe/Paris", Session: "s_1", New: true, Title: "t", Prompt: "p", Missed: "run_once"}
	cspec := client.ScheduleSpec{Cron: "0 9 * * 1-5", TZ: "Europe/Paris", Session: "s_1", New: true, Title: "t", Prompt: "p", Missed: "run_once"}
	sched := schedule.Schedule{ID: "sc_1", Tenant: "acme", Creator: "ann", Spec: spec, Paused: true, CreatedAt: wireTime,
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
		{"whoami/server/full", struct {
			User      string    `json:"user"`
			Tenant    string    `json:"tenant"`
			Admin     bool      `json:"admin"`
			Via       string    `json:"via"`
			ExpiresAt time.Time `json:"expires_at,omitzero"`
		}{"ann", "acme", true, "token", wireTime}},
		{"whoami/server/empty", struct {
			User      string    `json:"user"`
			Tenant    string    `json:"tenant"`
			Admin     bool      `json:"admin"`
			Via       string    `json:"via"`
			ExpiresAt time.Time `json:"expires_at,omitzero"`
		}{User: "ann"}},
		// POST /v1/tokens: what the client sends.
		{"token_request/client/full", client.TokenRequest{Name: "ci", ExpiresAt: wireTime, Role: session.RoleViewer}},
		{"token_request/client/empty", client.TokenRequest{Name: "ci"}},
		{"token_info/server/full", tokInfo},
		{"token_info/server/empty", auth.TokenInfo{ID: "tk_1", CreatedAt: wireTime}},
		{"token_info/client/full", ctokInfo},
		{"new_token/server", struct {
			Token string         `json:"token"`
			Info  auth.TokenInfo `json:"info"`
		}{"atr_tk_1_s", tokInfo}},
		{"new_token/client", client.NewToken{Token: "atr_tk_1_s", Info: ctokInfo}},
		{"token_list/server", struct {
			Tokens []auth.TokenInfo `json:"tokens"`
		}{[]auth.TokenInfo{tokInfo}}},
		{"audit_entry/server/full", auditEntry},
		{"audit_entry/server/empty", audit.Entry{ID: "a_1", Time: wireTime}},
		{"audit_entry/client/full", cauditEntry},
		{"audit_page/server", struct {
			Entries []audit.Entry `json:"entries"`
			Next    string        `json:"next"`
		}{[]audit.Entry{auditEntry}, "c1"}},
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
		{"schedule_list/server", struct {
			Schedules []schedule.Schedule `json:"schedules"`
		}{[]schedule.Schedule{sched}}},
		// Dead letters.
		{"dead_letter/server/full", dead},
		{"dead_letter/client/full", cdead},
		{"dead_letter/server/empty", dlq.Entry{}},
		{"dead_letter_list/server", struct {
			DeadLetters []dlq.Entry `json:"dead_letters"`
		}{[]dlq.Entry{dead}}},
		// Tasks.
		{"task_request/server/full", treq},
		{"task_request/client/full", ctreq},
		{"task_request/client/empty", client.TaskRequest{}},
		{"task/server/full", tk.View()},
		{"task/server/empty", task.Task{}.View()},
		{"task/client/full", ctk},
		{"started_task/server", struct {
			Task    string     `json:"task"`
			Session session.ID `json:"session"`
			Branch  string     `json:"branch"`
		}{"t_1", "s_1", "atrium/t_1"}},
		{"started_task/client", client.StartedTask{Task: "t_1", Session: "s_1", Branch: "atrium/t_1"}},
		// Sessions.
		{"create_session/client/template", client.CreateRequest{Title: "t", Harness: session.Harness{Template: "shell"}, Egress: []string{"example.com"}}},
		{"create_session/client/command", client.CreateRequest{Harness: session.Harness{Command: []string{"sh", "-c", "x"}, Stdin: "text"}}},
		{"create_session/client/agent", client.CreateRequest{Harness: session.Harness{Agent: "claude", PermissionMode: "auto"}}},
		{"create_session/client/empty", client.CreateRequest{}},
		{"session_patch/client/full", client.SessionPatch{Title: &title, Settings: map[string]any{"permission_mode": "auto", "turn_timeout": "10m"}}},
		{"session_patch/client/empty", client.SessionPatch{}},
		{"fork/client/full", client.ForkRequest{AtSeq: 5, Title: "f"}},
		{"fork/client/empty", client.ForkRequest{}},
		{"session_list/server", struct {
			Sessions []session.Session `json:"sessions"`
		}{[]session.Session{}}},
		{"message/client/full", struct {
			Text     string `json:"text"`
			ClientID string `json:"client_id,omitempty"`
		}{"hi", "c1"}},
		{"message/client/empty", struct {
			Text     string `json:"text"`
			ClientID string `json:"client_id,omitempty"`
		}{Text: "hi"}},
		{"approval/client", struct {
			Allow bool `json:"allow"`
		}{false}},
		{"approval/server/option", struct {
			Allow    *bool  `json:"allow,omitempty"`
			OptionID string `json:"option_id,omitempty"`
		}{&allow, "allow_once"}},
		{"member/client", struct {
			Role session.Role `json:"role"`
		}{session.RoleDriver}},
		{"member/server", struct {
			User string       `json:"user"`
			Role session.Role `json:"role"`
		}{"bob", session.RoleDriver}},
		{"secret/client", struct {
			Value string `json:"value"`
		}{"v"}},
		{"secret_list/server", struct {
			Secrets []session.SecretInfo `json:"secrets"`
		}{[]session.SecretInfo{}}},
		{"egress/client", struct {
			Allow []string `json:"allow"`
		}{[]string{}}},
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
