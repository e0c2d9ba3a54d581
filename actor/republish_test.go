package actor

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/session"
)

// TestHost_EventsSubjectCarriesOnlyStored: watchers of a session's Events
// subject receive what the events stream stored, republished by the stream,
// and nothing it refused: a publish of another event under a seq the stream
// already holds (a frozen owner's frame leaving its socket at the thaw, after
// the new owner wrote that seq) is refused as a duplicate Msg-Id and never
// reaches them (issue 21).
func TestHost_EventsSubjectCarriesOnlyStored(t *testing.T) {
	e := newEnv(t)
	id := e.create("alice", shell())
	w := e.watch(id)
	e.prompt(id, "alice", "echo one")
	w.until("turn 1 finished", finished(1))
	hist := e.history(id, "alice")
	if len(w.raw) > len(hist) || len(w.raw) < 4 {
		t.Fatalf("watcher saw %d events, history has %d", len(w.raw), len(hist))
	}
	for i, ev := range w.evs {
		if stored := hist[ev.Seq-1]; !bytes.Equal(w.raw[i], stored) {
			t.Fatalf("event %d published as\n  %s\nstored as\n  %s", ev.Seq, w.raw[i], stored)
		}
	}

	// A stale writer's event for seq 2, with the Msg-Id the stream holds.
	var evs []session.Event
	for _, raw := range hist {
		var ev session.Event
		if err := json.Unmarshal(raw, &ev); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	epoch := evs[0].Epoch
	stale := encodeEvent(2, epoch, time.Now().UTC(), session.KindMessage, "mallory", mustMarshal(session.MessageData{Text: "stale"}))
	js, err := jetstream.New(e.gw)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.PublishMsg(t.Context(), &nats.Msg{Subject: e.subj.Capture(id), Data: stale.JSON,
		Header: nats.Header{jetstream.MsgIDHeader: []string{msgID(epoch, 2)}}})
	if err != nil || !ack.Duplicate {
		t.Fatalf("stale publish: %+v, %v; want a duplicate ack", ack, err)
	}
	// Then a new prompt: its events follow, and the stale one is not
	// among what the watcher received before them.
	e.prompt(id, "alice", "echo two")
	w.until("turn 2 finished", finished(2))
	for i, raw := range w.raw {
		if bytes.Contains(raw, []byte("mallory")) {
			t.Fatalf("the watcher received the refused event at position %d: %s", i, raw)
		}
	}
	seqs := make([]session.Seq, len(w.evs))
	for i, ev := range w.evs {
		seqs[i] = ev.Seq
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Fatalf("watcher saw seqs %v, want each once, in order", seqs)
		}
	}

	// The republished message says which stream message it is.
	sub, err := e.gw.SubscribeSync(e.subj.Events(id))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	e.gw.Flush()
	e.prompt(id, "alice", "echo three")
	m, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get("Nats-Stream") != e.subj.EventsStream() || m.Header.Get("Nats-Subject") != e.subj.Events(id) {
		t.Errorf("republished headers %v; want Nats-Stream %s and Nats-Subject %s", m.Header, e.subj.EventsStream(), e.subj.Events(id))
	}
	if n, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64); err != nil || n == 0 {
		t.Errorf("republished Nats-Sequence %q", m.Header.Get("Nats-Sequence"))
	}
}

// TestHost_UpgradesEventsStream: a node starts on an events stream an older
// version made, which captured the Events subjects directly and holds a
// session's events under them, the last one published the old way: the
// node updates the stream (capture subjects, transform, republish), a node
// with no file of the session rebuilds it from the old messages, seq
// continues after them, and watchers receive the new events.
func TestHost_UpgradesEventsStream(t *testing.T) {
	ns := startJetStream(t)
	prov := newProvider(t)
	subj := session.Subjects{}
	gw := gatewayEnv(t, ns.ClientURL())
	js, err := jetstream.New(gw.gw)
	if err != nil {
		t.Fatal(err)
	}
	old := jetstream.StreamConfig{
		Name:       subj.EventsStream(),
		Subjects:   []string{subj.AllEvents(), subj.AllMeta()},
		Storage:    jetstream.FileStorage,
		MaxAge:     DefaultEventsMaxAge,
		Discard:    jetstream.DiscardOld,
		Duplicates: 2 * time.Minute,
	}
	if _, err := js.CreateStream(t.Context(), old); err != nil {
		t.Fatal(err)
	}
	// Node a writes the session; its stream is then set back to the old
	// configuration (as if an older node had written it all), and an
	// older node publishes one more event the old way.
	a := startNode(t, "a", ns.ClientURL(), prov, nil)
	id := gw.create("alice", shell())
	served(t, gw, id, session.Command{Op: session.OpPrompt, Text: "echo one"})
	waitTurn(t, gw, id, 1)
	before := historyOf(t, gw, id)
	ctx := t.Context()
	if err := a.host.Close(ctx); err != nil {
		t.Fatal(err)
	}
	a.nc.Close()
	if _, err := js.UpdateStream(ctx, old); err != nil {
		t.Fatalf("set the stream back to the old configuration: %v", err)
	}
	// Node a's drain wrote more (the sandbox's sleep): the stream's last
	// event is the one to follow.
	lastMsg, err := js.Stream(ctx, subj.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	lm, err := lastMsg.GetLastMsgForSubject(ctx, subj.Events(id))
	if err != nil {
		t.Fatal(err)
	}
	var last session.Event
	if err := json.Unmarshal(lm.Data, &last); err != nil {
		t.Fatal(err)
	}
	oldEv := encodeEvent(last.Seq+1, last.Epoch, time.Now().UTC(), session.KindMessage, "alice", mustMarshal(session.MessageData{Text: "written by an older version"}))
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subj.Events(id), Data: oldEv.JSON,
		Header: nats.Header{jetstream.MsgIDHeader: []string{msgID(last.Epoch, oldEv.Seq)}}}); err != nil {
		t.Fatalf("publish the old way: %v", err)
	}

	b := startNode(t, "b", ns.ClientURL(), prov, nil)
	st, err := js.Stream(ctx, subj.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if !slices.Equal(cfg.Subjects, []string{subj.AllCapture(), subj.AllMeta()}) || cfg.RePublish == nil || cfg.SubjectTransform == nil {
		t.Fatalf("stream after the upgrade: subjects %v, republish %+v, transform %+v", cfg.Subjects, cfg.RePublish, cfg.SubjectTransform)
	}
	w := gw.watch(id)
	rep := served(t, gw, id, session.Command{Op: session.OpPrompt, Text: "echo two"})
	if rep.Error != nil || rep.Seq <= oldEv.Seq {
		t.Fatalf("prompt after the upgrade: %+v, want a seq after the old version's last event %d", rep, oldEv.Seq)
	}
	got := w.until("turn 2 finished", finished(2))
	after := historyOf(t, gw, id)
	for i, raw := range before {
		if !bytes.Equal(raw, after[i]) {
			t.Fatalf("event %d after the upgrade:\n  %s\nwant\n  %s", i+1, after[i], raw)
		}
	}
	if !bytes.Equal(after[oldEv.Seq-1], oldEv.JSON) {
		t.Fatalf("event %d after the upgrade:\n  %s\nwant the old version's\n  %s", oldEv.Seq, after[oldEv.Seq-1], oldEv.JSON)
	}
	checkContiguous(t, decode(t, after))
	if w.evs[0].Seq > rep.Seq || got.Seq > session.Seq(len(after)) {
		t.Errorf("watcher saw seqs %d..%d, history ends at %d, prompt at %d", w.evs[0].Seq, got.Seq, len(after), rep.Seq)
	}
	for i, ev := range w.evs {
		if !bytes.Equal(w.raw[i], after[ev.Seq-1]) {
			t.Errorf("event %d published as\n  %s\nstored as\n  %s", ev.Seq, w.raw[i], after[ev.Seq-1])
		}
	}
	if _, ok := leaseOf(b.host, id); !ok {
		t.Error("node b holds no lease")
	}
}
