package session

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestID_Validate(t *testing.T) {
	for name, tc := range map[string]struct {
		id ID
		ok bool
	}{
		"generated":  {NewID(), true},
		"simple":     {"abc-DEF_123", true},
		"empty":      {"", false},
		"dot":        {"a.b", false},
		"wildcard":   {"a*", false},
		"gt":         {"a>", false},
		"slash":      {"../etc", false},
		"space":      {"a b", false},
		"too long":   {ID(strings.Repeat("a", MaxIDLen+1)), false},
		"max length": {ID(strings.Repeat("a", MaxIDLen)), true},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.id.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate(%q) = %v, want ok=%v", tc.id, err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error %v does not match ErrBadRequest", err)
			}
		})
	}
	if NewID() == NewID() {
		t.Fatal("NewID returned the same id twice")
	}
}

func TestError_IsAndAs(t *testing.T) {
	err := error(Errorf(CodeNotFound, "session %s not found", "x"))
	wrapped := errors.Join(errors.New("context"), err)
	if !errors.Is(wrapped, ErrNotFound) || errors.Is(wrapped, ErrForbidden) {
		t.Fatalf("errors.Is mismatched for %v", wrapped)
	}
	if got := AsError(wrapped); got.Code != CodeNotFound || got.Message != "session x not found" {
		t.Fatalf("AsError = %+v", got)
	}
	if got := AsError(errors.New("disk on fire at /secret/path")); got.Code != CodeInternal || strings.Contains(got.Message, "secret") {
		t.Fatalf("AsError leaked an internal error: %+v", got)
	}
	if CodeTooManyRequests.HTTPStatus() != 429 || CodePayloadTooLarge.HTTPStatus() != 413 || Code("weird").HTTPStatus() != 500 {
		t.Fatal("HTTPStatus mapping is wrong")
	}
}

func TestTime_JSON(t *testing.T) {
	in := Time{time.Date(2026, 11, 21, 10, 4, 5, 120000000, time.FixedZone("x", 3600))}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `"2026-11-21T09:04:05.120000000Z"` {
		t.Fatalf("Time marshals as %s, want UTC with 9 fractional digits", b)
	}
	var out Time
	if err := json.Unmarshal(b, &out); err != nil || !out.Equal(in.Time) {
		t.Fatalf("round trip = %v, %v", out, err)
	}
}

func TestAuthorize(t *testing.T) {
	for name, tc := range map[string]struct {
		role Role
		act  Action
		want error
	}{
		"stranger reads":  {RoleNone, ActRead, ErrNotFound},
		"viewer reads":    {RoleViewer, ActRead, nil},
		"viewer prompts":  {RoleViewer, ActDrive, ErrForbidden},
		"driver prompts":  {RoleDriver, ActDrive, nil},
		"driver manages":  {RoleDriver, ActManage, ErrForbidden},
		"owner manages":   {RoleOwner, ActManage, nil},
		"owner prompts":   {RoleOwner, ActDrive, nil},
		"bogus role read": {Role("admin"), ActRead, ErrNotFound},
	} {
		t.Run(name, func(t *testing.T) {
			err := Authorize(tc.role, tc.act)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("Authorize(%q, %v) = %v, want %v", tc.role, tc.act, err, tc.want)
			}
		})
	}
	if _, err := ParseRole("admin"); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("ParseRole(admin) = %v", err)
	}
}

func TestParseHarnessLine(t *testing.T) {
	for name, tc := range map[string]struct {
		line       string
		agent      bool
		typ, appID string
	}{
		"plain text":       {"hello world", false, "", ""},
		"json no type":     {`{"a":1}`, false, "", ""},
		"json number type": {`{"type":3}`, false, "", ""},
		"json array":       {`["type"]`, false, "", ""},
		"broken json":      {`{"type":"x"`, false, "", ""},
		"agent object":     {`{"type":"tool_use","name":"ls"}`, true, "tool_use", ""},
		"padded":           {"  {\"type\":\"x\"}\r", true, "x", ""},
		"approval":         {`{"type":"approval_request","id":"a1","summary":"rm -rf?"}`, true, "approval_request", "a1"},
		"approval no id":   {`{"type":"approval_request","summary":"?"}`, true, "approval_request", ""},
	} {
		t.Run(name, func(t *testing.T) {
			hl := ParseHarnessLine([]byte(tc.line))
			if (hl.Object != nil) != tc.agent || hl.Type != tc.typ || hl.ApprovalID != tc.appID {
				t.Fatalf("ParseHarnessLine(%q) = %+v", tc.line, hl)
			}
		})
	}
	data := AgentData(7, ParseHarnessLine([]byte(`{"type":"x","turn":99,"k":"v"}`)).Object)
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil || got["turn"] != float64(7) || got["k"] != "v" || got["type"] != "x" {
		t.Fatalf("AgentData = %s (%v)", data, err)
	}
}

func TestTurns(t *testing.T) {
	var q Turns
	q.Restore(4)
	if !q.Idle() {
		t.Fatal("new queue not idle")
	}
	q.Enqueue(Prompt{Seq: 10, Text: "a", By: "alice"})
	q.Enqueue(Prompt{Seq: 11, Text: "b", By: "bob"})
	first, ok := q.Next()
	if !ok || first.N != 5 || first.Prompt.By != "alice" {
		t.Fatalf("first turn = %+v, %v", first, ok)
	}
	if _, ok := q.Next(); ok {
		t.Fatal("a second turn started while one runs")
	}
	if err := q.RequestApproval(5, "a1"); err != nil {
		t.Fatal(err)
	}
	if err := q.RequestApproval(5, "a1"); !errors.Is(err, ErrConflict) {
		t.Fatalf("duplicate approval = %v", err)
	}
	if _, err := q.ResolveApproval("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown approval = %v", err)
	}
	if n, err := q.ResolveApproval("a1"); err != nil || n != 5 {
		t.Fatalf("ResolveApproval = %d, %v", n, err)
	}
	if _, err := q.Cancel(); err != nil || !q.Running().Cancelled {
		t.Fatalf("Cancel = %v", err)
	}
	if q.Finish(4) || !q.Finish(5) {
		t.Fatal("Finish accepted the wrong turn or refused the right one")
	}
	second, ok := q.Next()
	if !ok || second.N != 6 || second.Prompt.Seq != 11 || q.Queued() != 0 {
		t.Fatalf("second turn = %+v", second)
	}
	q.Finish(6)
	if !q.Idle() || q.LastTurn() != 6 {
		t.Fatal("queue not idle after all turns")
	}
	if _, err := q.Cancel(); !errors.Is(err, ErrConflict) {
		t.Fatalf("Cancel when idle = %v", err)
	}
}

func TestTurns_CancelPrompt(t *testing.T) {
	var q Turns
	q.Enqueue(Prompt{Seq: 10, Text: "a"})
	q.Enqueue(Prompt{Seq: 11, Text: "b"})
	q.Enqueue(Prompt{Seq: 12, Text: "c"})
	if _, ok := q.Next(); !ok {
		t.Fatal("no first turn")
	}
	if turn, err := q.CancelPrompt(11); err != nil || turn != nil {
		t.Fatalf("CancelPrompt(queued) = %v, %v", turn, err)
	}
	if turn, err := q.CancelPrompt(10); err != nil || turn == nil || turn.N != 1 || !turn.Cancelled {
		t.Fatalf("CancelPrompt(running) = %+v, %v", turn, err)
	}
	if _, err := q.CancelPrompt(9); !errors.Is(err, ErrConflict) {
		t.Fatalf("CancelPrompt(unknown) = %v", err)
	}
	q.Finish(1)
	second, _ := q.Next()
	if second.Prompt.Seq != 11 || !second.Prompt.Cancelled {
		t.Fatalf("second turn = %+v: want the cancelled prompt 11", second)
	}
	q.Finish(2)
	if third, _ := q.Next(); third.Prompt.Seq != 12 || third.Prompt.Cancelled {
		t.Fatalf("third turn = %+v: want prompt 12, not cancelled", third)
	}
}

func TestHarness_JSON(t *testing.T) {
	var h Harness
	if err := json.Unmarshal([]byte(`"shell"`), &h); err != nil || h.Template != "shell" {
		t.Fatalf("template form = %+v, %v", h, err)
	}
	if err := json.Unmarshal([]byte(`{"command":["bash","-c","x"]}`), &h); err != nil || len(h.Command) != 3 || h.Template != "" {
		t.Fatalf("command form = %+v, %v", h, err)
	}
	if err := json.Unmarshal([]byte(`42`), &h); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("bad form = %v", err)
	}
	if err := (Harness{Command: []string{}}).Validate(); err == nil {
		t.Fatal("empty command accepted")
	}
}

func TestAppendEventFrame(t *testing.T) {
	ev := json.RawMessage(`{"seq":1,"kind":"message"}`)
	frame := AppendEventFrame(nil, ev)
	var f EventFrame
	if err := json.Unmarshal(frame, &f); err != nil || f.Type != FrameEvent || string(f.Event) != string(ev) {
		t.Fatalf("frame %s decodes to %+v, %v", frame, f, err)
	}
}
