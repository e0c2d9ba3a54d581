package actor

import (
	"encoding/json"
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestPrompts_Batch sends several prompts in one OpPrompts: each is
// appended in order as OpPrompt would append it, and answered in its own
// result: a seq for a new prompt, the original seq for a client_id already
// used (before the batch, or earlier in it), an error for a prompt the
// session refuses, which appends nothing. A viewer's batch, an empty one
// and one over the limit are refused whole.
func TestPrompts_Batch(t *testing.T) {
	e := newEnv(t)
	id := e.create("alice", command("sleep", "60")) // the first turn holds: the rest only queue
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpMember, User: "vic", Role: session.RoleViewer}); rep.Error != nil {
		t.Fatal(rep.Error)
	}
	before := e.cmd(id, "alice", session.Command{Op: session.OpPrompt, Text: "first", ClientID: "c-0"})
	if before.Error != nil {
		t.Fatal(before.Error)
	}
	rep := e.cmd(id, "alice", session.Command{Op: session.OpPrompts, Prompts: []session.PromptItem{
		{Text: "one", ClientID: "c-1"},
		{Text: "again", ClientID: "c-0"}, // sent before the batch
		{Text: "  ", ClientID: "c-blank"},
		{Text: "two"},                        // no client_id
		{Text: "one again", ClientID: "c-1"}, // earlier in this batch
		{Text: "three", ClientID: "c-3"},
	}})
	if rep.Error != nil {
		t.Fatal(rep.Error)
	}
	if len(rep.Results) != 6 {
		t.Fatalf("%d results, want 6: %+v", len(rep.Results), rep)
	}
	r := rep.Results
	if e := r[2].Error; e == nil || e.Code != session.CodeBadRequest || r[2].Seq != 0 {
		t.Errorf("blank prompt: %+v, want bad_request", r[2])
	}
	for _, i := range []int{0, 1, 3, 4, 5} {
		if r[i].Error != nil || r[i].Seq == 0 {
			t.Fatalf("result %d: %+v", i, r[i])
		}
	}
	if !(before.Seq < r[0].Seq && r[0].Seq < r[3].Seq && r[3].Seq < r[5].Seq) {
		t.Errorf("new prompts at %d, %d, %d after %d: not in order", r[0].Seq, r[3].Seq, r[5].Seq, before.Seq)
	}
	if r[1].Seq != before.Seq || r[4].Seq != r[0].Seq {
		t.Errorf("repeated client_ids at %d and %d, want their originals %d and %d", r[1].Seq, r[4].Seq, before.Seq, r[0].Seq)
	}
	evs := decode(t, e.history(id, "alice"))
	checkContiguous(t, evs)
	var texts []string
	for _, ev := range evs {
		if ev.Kind != session.KindMessage {
			continue
		}
		var d session.MessageData
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			t.Fatal(err)
		}
		texts = append(texts, d.Text)
		if want := map[session.Seq]string{before.Seq: "first", r[0].Seq: "one", r[3].Seq: "two", r[5].Seq: "three"}[ev.Seq]; d.Text != want {
			t.Errorf("message at %d is %q, want %q", ev.Seq, d.Text, want)
		}
	}
	if len(texts) != 4 {
		t.Fatalf("messages %q, want first, one, two, three", texts)
	}

	for name, c := range map[string]struct {
		user string
		cmd  session.Command
		code session.Code
	}{
		"viewer":   {"vic", session.Command{Op: session.OpPrompts, Prompts: []session.PromptItem{{Text: "x"}}}, session.CodeForbidden},
		"empty":    {"alice", session.Command{Op: session.OpPrompts}, session.CodeBadRequest},
		"too many": {"alice", session.Command{Op: session.OpPrompts, Prompts: make([]session.PromptItem, session.MaxPromptsPerCommand+1)}, session.CodeBadRequest},
	} {
		if rep := e.cmd(id, c.user, c.cmd); rep.Error == nil || rep.Error.Code != c.code || rep.Results != nil {
			t.Errorf("%s: %+v, want %s", name, rep, c.code)
		}
	}
	// The first turn appends events of its own meanwhile (turn_started,
	// sandbox states): only messages count here.
	messages := 0
	for _, ev := range decode(t, e.history(id, "alice")) {
		if ev.Kind == session.KindMessage {
			messages++
		}
	}
	if messages != len(texts) {
		t.Errorf("refused batches appended %d messages", messages-len(texts))
	}
}
