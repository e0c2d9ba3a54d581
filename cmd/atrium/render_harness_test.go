package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

// TestHarnessAgentWhole: an `agent` event of a harness (a JSON line of the
// harness's stdout) is shown whole by `atrium logs` and `atrium attach` —
// its type and text, or its compact JSON when it has no text — on one line
// with control characters visible, never cut at 200 bytes (issue 18).
func TestHarnessAgentWhole(t *testing.T) {
	long := strings.Repeat("word ", 120) + "the end"
	withText := session.Event{Seq: 1, Time: session.Time{Time: time.Unix(0, 0)}, Kind: session.KindAgent, By: "system",
		Data: []byte(`{"turn":1,"type":"assistant","text":"` + long + `\nsecond line \u001b[31mred"}`)}
	input := strings.Repeat("x", 400)
	noText := session.Event{Seq: 2, Time: session.Time{Time: time.Unix(0, 0)}, Kind: session.KindAgent, By: "system",
		Data: []byte(`{"turn":1,"type":"tool_use","name":"edit","input":{"path":"\u003ca\u003e.go","n":12345678901234567890,"body":"` + input + `"}}`)}

	var out bytes.Buffer
	p := &eventPrinter{out: &out, now: time.Unix(0, 0)}
	for _, ev := range []session.Event{withText, noText} {
		if err := p.print(ev, nil); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("logs printed %d lines, want one per event:\n%s", len(lines), out.String())
	}
	if !strings.Contains(lines[0], "assistant: word word") || !strings.Contains(lines[0], "the end ⏎ second line") || strings.Contains(lines[0], "\x1b") || !strings.Contains(lines[0], "red") {
		t.Errorf("logs, agent text: %q", lines[0])
	}
	if !strings.Contains(lines[1], input+`"`) || !strings.Contains(lines[1], `"path":"<a>.go"`) || !strings.Contains(lines[1], `"n":12345678901234567890`) || strings.Contains(lines[1], "…") {
		t.Errorf("logs, agent JSON: %q", lines[1])
	}

	var aout, aerr bytes.Buffer
	v := attachView{env: &cliEnv{stdout: &aout, stderr: &aerr}, pending: map[string]bool{}}
	v.event(&aout, &aerr, withText)
	v.event(&aout, &aerr, noText)
	got := aout.String()
	if !strings.Contains(got, "the end ⏎ second line") || strings.Contains(got, "\x1b") || !strings.Contains(got, input+`"`) || strings.Contains(got, "…") {
		t.Errorf("attach printed %q", got)
	}
}
