package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
)

// shellHarness is the built-in template that runs each prompt with bash.
var shellHarness = session.Harness{Template: "shell"}

// CreateSession creates a session through gateway gw.
func (c *Cluster) CreateSession(gw int, title string, h session.Harness) session.Session {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	s, err := c.Client(gw).CreateSession(ctx, client.CreateRequest{Title: title, Harness: h})
	if err != nil {
		c.t.Fatalf("create session through %s: %v", c.Gateways[gw].Name, err)
	}
	return s
}

// History reads session id's whole history through gateway gw.
func (c *Cluster) History(gw int, id session.ID) []recorded {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	cl := c.Client(gw)
	var out []recorded
	var after session.Seq
	for {
		page, err := cl.Events(ctx, id, after, 0)
		if err != nil {
			c.t.Fatalf("history of %s after %d through %s: %v", id, after, c.Gateways[gw].Name, err)
		}
		for i, ev := range page.Events {
			out = append(out, record(ev, page.Raw[i]))
			after = ev.Seq
		}
		if len(page.Events) == 0 || after >= page.LastSeq {
			return out
		}
	}
}

// recorded is one event as a client saw it: its seq and kind, and its
// bytes in compact form so that two sightings of one event compare equal.
type recorded struct {
	Seq  session.Seq
	Kind session.Kind
	Data json.RawMessage
	Raw  string
}

func record(ev session.Event, raw json.RawMessage) recorded {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		b.Reset()
		b.Write(raw)
	}
	return recorded{Seq: ev.Seq, Kind: ev.Kind, Data: ev.Data, Raw: b.String()}
}

// clientIDOf returns the client_id of a message event.
func (r recorded) clientIDOf() string {
	if r.Kind != session.KindMessage {
		return ""
	}
	var d session.MessageData
	json.Unmarshal(r.Data, &d)
	return d.ClientID
}

// outputText returns the text of an output event.
func (r recorded) outputText() string {
	if r.Kind != session.KindOutput {
		return ""
	}
	var d struct {
		Text string `json:"text"`
	}
	json.Unmarshal(r.Data, &d)
	return d.Text
}

// Watcher records every event one WebSocket stream delivers.
type Watcher struct {
	Name string
	// After is the seq the watcher resumed after: its first event is
	// After+1.
	After  session.Seq
	stream *client.Stream

	mu         sync.Mutex
	events     []recorded // guarded by mu
	reconnects int        // guarded by mu
	frameErrs  []string   // error frames; guarded by mu

	done chan struct{}
}

// Watch opens a stream of session id through gateway gw, resuming after
// after; the stream reconnects (to the same gateway) when its connection is
// lost. It is closed when the test ends.
func (c *Cluster) Watch(gw int, id session.ID, after session.Seq) *Watcher {
	c.t.Helper()
	// The stream lives until Close; Watch's own handshake is bounded by
	// its HelloTimeout.
	st, err := c.Client(gw).Watch(context.Background(), id, after, client.WatchOptions{
		MinBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond, Buffer: 4096,
	})
	if err != nil {
		c.t.Fatalf("watch %s through %s: %v", id, c.Gateways[gw].Name, err)
	}
	w := &Watcher{Name: c.Gateways[gw].Name, After: after, stream: st, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for f := range st.Frames() {
			w.mu.Lock()
			switch f.Type {
			case session.FrameEvent:
				w.events = append(w.events, record(*f.Event, f.Raw))
			case client.FrameReconnecting:
				w.reconnects++
			case session.FrameError:
				w.frameErrs = append(w.frameErrs, fmt.Sprintf("%s: %s", f.Error.Code, f.Error.Message))
			}
			w.mu.Unlock()
		}
	}()
	c.t.Cleanup(w.Close)
	return w
}

// Close ends the stream and waits for its reader.
func (w *Watcher) Close() {
	w.stream.Close()
	<-w.done
}

// Events returns what the watcher has seen so far.
func (w *Watcher) Events() []recorded {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]recorded(nil), w.events...)
}

// Reconnects returns how many times the stream lost its connection.
func (w *Watcher) Reconnects() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reconnects
}

// LastSeq returns the seq of the last event seen, 0 if none.
func (w *Watcher) LastSeq() session.Seq {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.events) == 0 {
		return 0
	}
	return w.events[len(w.events)-1].Seq
}

// WaitFor polls until cond holds of the events seen, failing the test after
// waitBound.
func (w *Watcher) WaitFor(t testing.TB, what string, cond func([]recorded) bool) []recorded {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for {
		evs := w.Events()
		if cond(evs) {
			return evs
		}
		select {
		case <-w.done:
			t.Fatalf("watcher on %s ended (%v) before %s; saw %d events", w.Name, w.stream.Err(), what, len(evs))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("watcher on %s: no %s after %v; saw %d events, last seq %d", w.Name, what, waitBound, len(evs), w.LastSeq())
		}
		time.Sleep(pollEvery)
	}
}

// WaitSeq waits until the watcher has seen seq.
func (w *Watcher) WaitSeq(t testing.TB, seq session.Seq) []recorded {
	t.Helper()
	return w.WaitFor(t, fmt.Sprintf("event %d", seq), func(evs []recorded) bool {
		return len(evs) > 0 && evs[len(evs)-1].Seq >= seq
	})
}

// turnFinished reports whether evs hold a turn_finished event.
func turnFinished(evs []recorded) bool {
	for _, e := range evs {
		if e.Kind == session.KindTurnFinished {
			return true
		}
	}
	return false
}

// countKind counts the events of kind k.
func countKind(evs []recorded, k session.Kind) int {
	n := 0
	for _, e := range evs {
		if e.Kind == k {
			n++
		}
	}
	return n
}

// checkContiguous fails unless evs have seqs from+1, from+2, … exactly once
// each, in order.
func checkContiguous(t testing.TB, who string, evs []recorded, from session.Seq) {
	t.Helper()
	want := from + 1
	for i, e := range evs {
		if e.Seq != want {
			t.Errorf("%s: event %d has seq %d, want %d (a gap, duplicate or reordering)", who, i, e.Seq, want)
			return
		}
		want++
	}
}

// checkSameEvents fails unless a's events are exactly the events of history
// with the same seqs: the same bytes, so no fork.
func checkSameEvents(t testing.TB, who string, a, history []recorded) {
	t.Helper()
	bySeq := map[session.Seq]recorded{}
	for _, e := range history {
		bySeq[e.Seq] = e
	}
	forks := 0
	for _, e := range a {
		h, ok := bySeq[e.Seq]
		if !ok {
			t.Errorf("%s saw seq %d (%s), which is not in the history", who, e.Seq, e.Kind)
			forks++
		} else if h.Raw != e.Raw {
			t.Errorf("%s saw a different event at seq %d than the history holds (a fork):\n  saw     %s\n  history %s", who, e.Seq, e.Raw, h.Raw)
			forks++
		}
		if forks > 5 {
			t.Fatalf("%s: more than 5 events differ from the history", who)
		}
	}
}

// checkAcked fails unless every acked client_id is a message event of the
// history at its acked seq, and no client_id appears twice.
func checkAcked(t testing.TB, history []recorded, acked map[string]session.Seq) {
	t.Helper()
	where := map[string]session.Seq{}
	for _, e := range history {
		id := e.clientIDOf()
		if id == "" {
			continue
		}
		if prev, dup := where[id]; dup {
			t.Errorf("client_id %s is in the history twice: seq %d and %d", id, prev, e.Seq)
		}
		where[id] = e.Seq
	}
	missing := 0
	for id, seq := range acked {
		got, ok := where[id]
		switch {
		case !ok:
			missing++
			if missing <= 5 {
				t.Errorf("acknowledged prompt %s (seq %d) is missing from the history", id, seq)
			}
		case got != seq:
			t.Errorf("acknowledged prompt %s was acked at seq %d but is at seq %d in the history", id, seq, got)
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d acknowledged prompts are missing from the history", missing, len(acked))
	}
}

// Prompter sends prompts to one session continuously, round-robin through
// the gateways, and records each acknowledgement. A prompt that fails is not
// retried (it was not acknowledged: it may or may not be in the history).
type Prompter struct {
	c    *Cluster
	id   session.ID
	text string

	mu      sync.Mutex
	acked   map[string]session.Seq // client_id → seq; guarded by mu
	failed  int                    // guarded by mu
	lastErr error                  // guarded by mu

	sent   atomic.Int64
	cancel context.CancelFunc
	done   chan struct{}
}

// StartPrompter starts sending prompts with text to session id until Stop.
func (c *Cluster) StartPrompter(id session.ID, text string) *Prompter {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Prompter{c: c, id: id, text: text, acked: map[string]session.Seq{}, cancel: cancel, done: make(chan struct{})}
	clients := make([]*client.Client, len(c.Gateways))
	for i := range c.Gateways {
		clients[i] = c.Client(i)
	}
	go func() {
		defer close(p.done)
		for i := 0; ctx.Err() == nil; i++ {
			cid := fmt.Sprintf("p-%d-%s", i, client.NewClientID())
			rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
			seq, err := clients[i%len(clients)].Send(rctx, id, p.text, cid)
			rcancel()
			p.sent.Add(1)
			p.mu.Lock()
			if err == nil {
				p.acked[cid] = seq
			} else if ctx.Err() == nil {
				p.failed++
				p.lastErr = err
			}
			p.mu.Unlock()
			if err != nil && ctx.Err() == nil {
				time.Sleep(50 * time.Millisecond) // Back off while the cluster recovers.
			}
		}
	}()
	c.t.Cleanup(p.Stop)
	return p
}

// Stop stops sending and waits for the prompt in flight.
func (p *Prompter) Stop() {
	p.cancel()
	<-p.done
}

// Acked returns the acknowledged prompts so far.
func (p *Prompter) Acked() map[string]session.Seq {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]session.Seq, len(p.acked))
	for k, v := range p.acked {
		out[k] = v
	}
	return out
}

// Stats returns how many prompts were acknowledged and how many failed,
// with the last failure.
func (p *Prompter) Stats() (acked, failed int, lastErr error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.acked), p.failed, p.lastErr
}

// WaitAcked waits until n more prompts than now have been acknowledged.
func (p *Prompter) WaitAcked(t testing.TB, n int) {
	t.Helper()
	start, _, _ := p.Stats()
	deadline := time.Now().Add(waitBound)
	for {
		a, f, err := p.Stats()
		if a >= start+n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("prompter: %d acked, %d failed (last: %v) after %v; wanted %d more acks", a, f, err, waitBound, n)
		}
		time.Sleep(pollEvery)
	}
}

// SendUntilAcked sends one prompt through gateway gw, retrying with new
// client_ids until one is acknowledged, and returns its seq and the time of
// the ack.
func (c *Cluster) SendUntilAcked(gw int, id session.ID, text string) (string, session.Seq, time.Time) {
	c.t.Helper()
	cl := c.Client(gw)
	deadline := time.Now().Add(waitBound)
	var last error
	for time.Now().Before(deadline) {
		cid := client.NewClientID()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		seq, err := cl.Send(ctx, id, text, cid)
		cancel()
		if err == nil {
			return cid, seq, time.Now()
		}
		last = err
		time.Sleep(pollEvery)
	}
	c.t.Fatalf("no prompt to %s acknowledged through %s within %v: %v", id, c.Gateways[gw].Name, waitBound, last)
	return "", 0, time.Time{}
}

// EventTap subscribes to a session's events subject directly on NATS and
// records every publication, so that a second writer is seen even if no
// history keeps its events.
type EventTap struct {
	sub *nats.Subscription

	mu   sync.Mutex
	seen map[session.Seq][]string // compact bytes of each publication; guarded by mu
}

// Tap subscribes to session id's events on NATS server i.
func (c *Cluster) Tap(id session.ID) *EventTap {
	c.t.Helper()
	tap := &EventTap{seen: map[session.Seq][]string{}}
	sub, err := c.nc.Subscribe(session.Subjects{}.Events(id), func(m *nats.Msg) {
		if m.Header.Get(session.HeaderControl) != "" {
			return
		}
		var ev session.Event
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			return // not an event: nothing to compare
		}
		r := record(ev, m.Data)
		tap.mu.Lock()
		tap.seen[ev.Seq] = append(tap.seen[ev.Seq], r.Raw)
		tap.mu.Unlock()
	})
	if err != nil {
		c.t.Fatalf("subscribe to events of %s: %v", id, err)
	}
	if err := c.nc.Flush(); err != nil {
		c.t.Fatalf("flush: %v", err)
	}
	tap.sub = sub
	c.t.Cleanup(func() { sub.Unsubscribe() })
	return tap
}

// Forks returns the seqs published with two different events.
func (tap *EventTap) Forks() []string {
	tap.mu.Lock()
	defer tap.mu.Unlock()
	var out []string
	for seq, raws := range tap.seen {
		for _, r := range raws[1:] {
			if r != raws[0] {
				out = append(out, fmt.Sprintf("seq %d was published first as\n  %s\nthen as\n  %s", seq, raws[0], r))
				break
			}
		}
	}
	return out
}

// StreamEvents reads every message the events stream holds for session id
// and returns, per seq, the compact bytes of each. A consumer whose pull
// finds no responder for a moment (its creation has yet to reach the server
// that serves it) is made again, as Leases does.
func (c *Cluster) StreamEvents(id session.ID) (map[session.Seq][]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	return retryNoResponders(ctx, func() (map[session.Seq][]string, error) { return c.streamEvents(ctx, id) })
}

func (c *Cluster) streamEvents(ctx context.Context, id session.ID) (map[session.Seq][]string, error) {
	subj := session.Subjects{}
	cons, err := c.js.OrderedConsumer(ctx, subj.EventsStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subj.Events(id)},
	})
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", subj.EventsStream(), err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("stream consumer info: %w", err)
	}
	out := map[session.Seq][]string{}
	left := info.NumPending
	for left > 0 {
		batch, err := cons.Fetch(int(min(left, 500)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("fetch from stream: %w", err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			var ev session.Event
			if err := json.Unmarshal(m.Data(), &ev); err != nil {
				return nil, fmt.Errorf("stream message %q is not an event: %w", m.Data(), err)
			}
			out[ev.Seq] = append(out[ev.Seq], record(ev, m.Data()).Raw)
		}
		if err := batch.Error(); err != nil {
			return nil, fmt.Errorf("fetch from stream: %w", err)
		}
		if n == 0 {
			return nil, fmt.Errorf("the stream stopped with %d messages left", left)
		}
		left -= uint64(n)
	}
	return out, nil
}

// waitUntil polls cond until it returns nil, failing the test with its last
// error after waitBound.
func waitUntil(t testing.TB, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, waitBound, err)
		}
		time.Sleep(pollEvery)
	}
}

// logLineTime returns the time of the first line of a text log (slog's
// TextHandler) containing every one of parts.
func logLineTime(log string, parts ...string) (time.Time, error) {
	for line := range strings.SplitSeq(log, "\n") {
		all := true
		for _, p := range parts {
			if !strings.Contains(line, p) {
				all = false
				break
			}
		}
		if !all {
			continue
		}
		ts, ok := strings.CutPrefix(line, "time=")
		if !ok {
			return time.Time{}, fmt.Errorf("the log line has no time= first: %s", line)
		}
		ts, _, _ = strings.Cut(ts, " ")
		t, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			return time.Time{}, fmt.Errorf("parse the time of %q: %w", line, err)
		}
		return t, nil
	}
	return time.Time{}, fmt.Errorf("no log line with %q", parts)
}
