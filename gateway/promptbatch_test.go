package gateway_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

// TestWS_PromptBatches: prompt frames that queue up on one WebSocket go to
// the session together (session.OpPrompts), and each is still answered on
// its own, in frame order: an ack with its seq for a prompt, an error frame
// with its client_id for a prompt the session refuses. (client_id
// deduplication within a batch is the node's: actor's TestPrompts_Batch.) Against a node that predates
// OpPrompts the gateway sends them one by one, with the same answers.
func TestWS_PromptBatches(t *testing.T) {
	eachPromptsNode(t, func(t *testing.T, e *env) {
		s := e.create("alice", "batches")
		c := e.dial(s.ID, "alice", 0)
		c.nextOf(session.FrameHello)
		c.events(1)

		// Bursts of frames until one burst reached the node as
		// OpPrompts (a burst the publisher takes in one go): bounded
		// by a deadline, not by luck in one round.
		deadline := time.Now().Add(waitTimeout)
		for round := 0; len(e.node.commands(session.OpPrompts)) == 0; round++ {
			if time.Now().After(deadline) {
				t.Fatalf("no prompt frames were sent together in %d bursts", round)
			}
			burst(t, e, c, s.ID, "r"+strconv.Itoa(round))
		}
	})
}

// burst sends 40 prompt frames at once, among them a blank prompt the node
// refuses, and checks every answer.
func burst(t *testing.T, e *env, c *wsClient, id session.ID, name string) {
	t.Helper()
	first := session.Seq(len(e.node.Events(id)) + 1)
	const n = 40
	type sent struct {
		cid   string
		blank bool
	}
	var frames []sent
	for i := range n {
		f := sent{cid: name + "-" + strconv.Itoa(i), blank: i == 20}
		frames = append(frames, f)
		text := "batched " + strconv.Itoa(i)
		if f.blank {
			text = "   "
		}
		c.send(map[string]string{"type": "prompt", "text": text, "client_id": f.cid})
	}
	// Answers come in frame order: acks and errors alike.
	seqs := make([]session.Seq, n)
	next := first
	for i := 0; i < n; {
		fr := c.next()
		switch fr["type"] {
		case session.FrameAck, session.FrameError:
		default:
			continue
		}
		f := frames[i]
		if got := fr["client_id"]; got != f.cid {
			t.Fatalf("answer %d is for %v, want %s: answers out of frame order (%v)", i, got, f.cid, fr)
		}
		switch {
		case f.blank:
			if fr["type"] != session.FrameError || fr["code"] != string(session.CodeBadRequest) {
				t.Fatalf("blank prompt %d answered %v, want a bad_request error", i, fr)
			}
		case fr["type"] != session.FrameAck:
			t.Fatalf("prompt %d answered %v", i, fr)
		default:
			seqs[i] = session.Seq(fr["seq"].(float64))
			if seqs[i] != next {
				t.Fatalf("prompt %d acked at %d, want %d", i, seqs[i], next)
			}
			next++
		}
		i++
	}
	evs := e.node.Events(id)
	if got, want := len(evs), int(next-1); got != want {
		t.Fatalf("history has %d events, want %d", got, want)
	}
	for i, f := range frames {
		if seqs[i] == 0 {
			continue
		}
		if ev := string(evs[seqs[i]-1]); !strings.Contains(ev, `"client_id":"`+f.cid+`"`) || !strings.Contains(ev, `"batched `+strconv.Itoa(i)+`"`) {
			t.Fatalf("event %d is %s, want prompt %d", seqs[i], ev, i)
		}
	}
}

// TestREST_PromptBatches: POST …/messages requests that arrive together
// for one session go to it in OpPrompts requests, and each is still
// answered on its own: 202 with its own seq, or the node's refusal of its
// prompt alone. Against a node that predates OpPrompts they are sent one by
// one, with the same answers.
func TestREST_PromptBatches(t *testing.T) {
	eachPromptsNode(t, func(t *testing.T, e *env) {
		s := e.create("alice", "rest batches")
		deadline := time.Now().Add(waitTimeout)
		for round := 0; len(e.node.commands(session.OpPrompts)) == 0; round++ {
			if time.Now().After(deadline) {
				t.Fatalf("no prompts were sent together in %d rounds", round)
			}
			restBurst(t, e, s.ID, "r"+strconv.Itoa(round))
		}
	})
}

// restBurst posts 32 prompts at once, one of them blank (the node refuses
// it), and checks every answer against the history.
func restBurst(t *testing.T, e *env, id session.ID, name string) {
	t.Helper()
	const n = 32
	type answer struct {
		status int
		body   []byte
	}
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			text := "posted " + name + "-" + strconv.Itoa(i)
			if i == 7 {
				text = "   "
			}
			st, body := e.call("POST", "/v1/sessions/"+string(id)+"/messages", "alice",
				map[string]string{"text": text, "client_id": name + "-" + strconv.Itoa(i)})
			answers[i] = answer{st, body}
		})
	}
	wg.Wait()
	evs := e.node.Events(id)
	seen := map[session.Seq]bool{}
	for i, a := range answers {
		if i == 7 {
			if a.status != http.StatusBadRequest || !strings.Contains(string(a.body), "prompt text is empty") {
				t.Fatalf("blank prompt: %d %s, want 400", a.status, a.body)
			}
			continue
		}
		var acc struct{ Seq session.Seq }
		if a.status != http.StatusAccepted || json.Unmarshal(a.body, &acc) != nil || acc.Seq < 1 || int(acc.Seq) > len(evs) {
			t.Fatalf("prompt %d: %d %s", i, a.status, a.body)
		}
		if seen[acc.Seq] {
			t.Fatalf("prompt %d got seq %d, given before", i, acc.Seq)
		}
		seen[acc.Seq] = true
		if ev := string(evs[acc.Seq-1]); !strings.Contains(ev, `"posted `+name+"-"+strconv.Itoa(i)+`"`) {
			t.Fatalf("seq %d of prompt %d is %s", acc.Seq, i, ev)
		}
	}
}

// eachPromptsNode runs f, as a subtest, against a node that takes
// OpPrompts and one that predates it (it answers "unknown op").
func eachPromptsNode(t *testing.T, f func(t *testing.T, e *env)) {
	for _, old := range []bool{false, true} {
		name := "node with prompts"
		if old {
			name = "node without prompts"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.node.mu.Lock()
			e.node.noPrompts = old
			e.node.mu.Unlock()
			f(t, e)
		})
	}
}
