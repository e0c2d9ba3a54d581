package bench

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

func eventFrame(t testing.TB, seq session.Seq, at time.Time) []byte {
	t.Helper()
	raw, err := json.Marshal(session.Event{
		Seq: seq, Epoch: "e1", Time: session.Time{Time: at}, Kind: session.KindMessage, By: "alice",
		Data: session.MustData(session.MessageData{Text: `say "time":"no"`, ClientID: "c1"}),
	})
	if err != nil {
		t.Fatal(err)
	}
	return session.AppendEventFrame(nil, raw)
}

func TestParseEventFrame(t *testing.T) {
	at := time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.UTC)
	for name, tc := range map[string]struct {
		frame   []byte
		ok      bool
		seq     session.Seq
		timeEq  time.Time
		checkTm bool
	}{
		"wire frame":     {frame: eventFrame(t, 42, at), ok: true, seq: 42, timeEq: at, checkTm: true},
		"reordered keys": {frame: []byte(`{"event":{"time":"2025-03-04T05:06:07.5+01:00","seq":7},"type":"event"}`), ok: true, seq: 7, timeEq: time.Date(2025, 3, 4, 4, 6, 7, 5e8, time.UTC), checkTm: true},
		"presence":       {frame: []byte(`{"type":"presence","watchers":[]}`)},
		"ack":            {frame: []byte(`{"type":"ack","client_id":"x","seq":3}`)},
		"garbage":        {frame: []byte(`{"type":"event","event":`)},
	} {
		t.Run(name, func(t *testing.T) {
			seq, tm, ok := parseEventFrame(tc.frame)
			if ok != tc.ok || seq != tc.seq {
				t.Fatalf("parseEventFrame = %d, %v, %v; want %d, %v", seq, tm, ok, tc.seq, tc.ok)
			}
			if tc.checkTm && !tm.Equal(tc.timeEq) {
				t.Fatalf("time = %v, want %v", tm, tc.timeEq)
			}
		})
	}
}

func TestParseAckFrame(t *testing.T) {
	b, _ := json.Marshal(session.AckFrame{Type: session.FrameAck, ClientID: "c-1", Seq: 99})
	if cid, seq, ok := parseAckFrame(b); !ok || seq != 99 || cid != "c-1" {
		t.Fatalf("parseAckFrame(%s) = %q, %d, %v", b, cid, seq, ok)
	}
	if cid, seq, ok := parseAckFrame([]byte(`{"seq":7,"client_id":"x","type":"ack"}`)); !ok || seq != 7 || cid != "x" {
		t.Fatalf("reordered ack = %q, %d, %v", cid, seq, ok)
	}
	for _, f := range []string{`{"type":"error","code":"forbidden"}`, string(eventFrame(t, 3, time.Now()))} {
		if _, _, ok := parseAckFrame([]byte(f)); ok {
			t.Fatalf("%s parsed as an ack", f)
		}
	}
}

func BenchmarkParseEventFrame(b *testing.B) {
	frame := eventFrame(b, 123456, time.Now())
	b.ReportAllocs()
	for b.Loop() {
		if _, _, ok := parseEventFrame(frame); !ok {
			b.Fatal("not parsed")
		}
	}
}

func TestParseEventsFrame(t *testing.T) {
	ev := func(seq int, text string) string {
		return fmt.Sprintf(`{"seq":%d,"epoch":"e","time":"2026-01-02T03:04:05Z","kind":"output","by":"system","data":{"text":%q}}`, seq, text)
	}
	frame := session.EventsFrameHead + ev(7, `a "}{" brace`) + "," + ev(8, `back\slash}`) + "," + ev(9, "[]") + session.EventsFrameTail
	seqs, ok := parseEventsFrame([]byte(frame), nil)
	if !ok || fmt.Sprint(seqs) != "[7 8 9]" {
		t.Fatalf("parseEventsFrame = %v, %v; want [7 8 9]", seqs, ok)
	}
	for _, bad := range []string{
		`{"type":"event","event":` + ev(1, "x") + `}`,
		session.EventsFrameHead + ev(1, "x"), // cut short
		session.EventsFrameHead + `{"kind":"x"}` + session.EventsFrameTail,
	} {
		if seqs, ok := parseEventsFrame([]byte(bad), nil); ok {
			t.Errorf("parseEventsFrame(%s) = %v, ok", bad, seqs)
		}
	}
}
