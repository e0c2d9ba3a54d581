package gateway

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats.go"
)

// tricky are texts that break naive scanners of JSON.
var tricky = []string{
	"plain", `"quoted"`, `back\slash`, `ends with \`, `\"`, "]}", "{[", `","kind":"x"`, "<b>&amp;</b>",
	"line\nbreak", "\u2028", "ünï", "\x01", "",
}

// nodeEvent encodes an event the way the node does.
func nodeEvent(t testing.TB, seq session.Seq, kind session.Kind, data any) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(session.Event{
		Seq: seq, Epoch: "ep0ch", Time: session.Time{Time: time.Unix(1700000000, 5)}, Kind: kind, By: "alice",
		Data: session.MustData(data),
	}); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

func TestScanEventHead(t *testing.T) {
	for i, text := range tricky {
		raw := nodeEvent(t, session.Seq(i+1), session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: text})
		seq, kind, ok := scanEventHead(raw)
		if !ok || seq != session.Seq(i+1) || kind != session.KindOutput {
			t.Errorf("%s: got %d %q %v", raw, seq, kind, ok)
		}
	}
	for name, raw := range map[string]string{
		"other key order":    `{"kind":"output","seq":3,"epoch":"e","time":"t","data":{}}`,
		"escaped epoch":      `{"seq":3,"epoch":"e\"","time":"t","kind":"output"}`,
		"leading zero":       `{"seq":03,"epoch":"e","time":"t","kind":"output"}`,
		"negative":           `{"seq":-3,"epoch":"e","time":"t","kind":"output"}`,
		"unterminated kind":  `{"seq":3,"epoch":"e","time":"t","kind":"output`,
		"kind not followed":  `{"seq":3,"epoch":"e","time":"t","kind":"output"x`,
		"spaces":             `{ "seq":3,"epoch":"e","time":"t","kind":"output"}`,
		"too many digits":    `{"seq":1234567890123456789,"epoch":"e","time":"t","kind":"output"}`,
		"not an object":      `[1]`,
		"seq is not numeric": `{"seq":"3","epoch":"e","time":"t","kind":"output"}`,
	} {
		if seq, kind, ok := scanEventHead([]byte(raw)); ok {
			t.Errorf("%s: scanned %d %q from %s", name, seq, kind, raw)
		}
	}
	// What the fast path refuses is decoded in full.
	ev, err := parseEvent([]byte(`{"kind":"output","seq":3,"epoch":"e","data":{}}`), false)
	if err != nil || ev.seq != 3 || ev.kind != session.KindOutput {
		t.Fatalf("fallback: %+v %v", ev, err)
	}
	if _, err := parseEvent([]byte(`{"seq":0,"epoch":"e","time":"t","kind":"output"}`), false); err == nil {
		t.Fatal("seq 0 accepted")
	}
	ev, err = parseEvent(nodeEvent(t, 9, session.KindMemberChanged, session.MemberChangedData{User: "bob", Role: session.RoleViewer}), true)
	if err != nil || ev.member == nil || ev.member.User != "bob" || ev.member.Role != session.RoleViewer || !bytes.HasPrefix(ev.frame, []byte(`{"type":"event"`)) {
		t.Fatalf("member_changed: %+v %v", ev, err)
	}
}

func TestDecodeReply(t *testing.T) {
	var events []json.RawMessage
	for i, text := range tricky {
		events = append(events, nodeEvent(t, session.Seq(i+1), session.KindOutput, session.OutputData{Text: text}))
	}
	encode := func(r session.Reply) []byte {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(r); err != nil {
			t.Fatal(err)
		}
		return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
	}
	sess := session.Session{ID: "s_1", Title: "t"}
	for name, c := range map[string]struct {
		data []byte
		fast bool // scanReply reads it
	}{
		"ok":           {[]byte(`{}`), true},
		"seq":          {encode(session.Reply{Seq: 42}), true},
		"history":      {encode(session.Reply{Events: events, LastSeq: 99, Epoch: "ep0ch", More: true}), true},
		"empty page":   {encode(session.Reply{LastSeq: 7, Epoch: "ep0ch"}), true},
		"one event":    {encode(session.Reply{Events: events[:1], LastSeq: 1, Epoch: "e"}), true},
		"session":      {encode(session.Reply{Session: &sess}), false},
		"spaces":       {[]byte(`{"seq": 42}`), false},
		"seq zero":     {[]byte(`{"seq":0}`), false},
		"more false":   {[]byte(`{"more":false}`), false},
		"bad epoch":    {[]byte(`{"epoch":"a\"b"}`), false},
		"truncated":    {[]byte(`{"events":[{"seq":1}`), false},
		"unknown key":  {[]byte(`{"seq":1,"x":2}`), false},
		"results":      {encode(session.Reply{Results: []session.Reply{{Seq: 3}, {Seq: 4}, {}}}), true},
		"result error": {encode(session.Reply{Results: []session.Reply{{Seq: 3}, {Error: session.Errorf(session.CodeBadRequest, "x")}}}), false},
		"results cut":  {[]byte(`{"results":[{"seq":1},{"seq":2}`), false},
	} {
		want := &session.Reply{}
		if err := json.Unmarshal(c.data, want); err != nil {
			if c.fast {
				t.Fatalf("%s: %v", name, err)
			}
			want = nil
		}
		got, ok := scanReply(c.data)
		if ok != c.fast {
			t.Errorf("%s: scanned %v, want %v", name, ok, c.fast)
		}
		if !ok {
			continue
		}
		if len(want.Events) == 0 {
			want.Events = nil
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got %+v\nwant %+v", name, got, want)
		}
	}

	r, err := decodeReply("subj", &nats.Msg{Data: encode(session.Reply{Error: session.Errorf(session.CodeForbidden, "no")})})
	if r != nil || session.AsError(err).Code != session.CodeForbidden {
		t.Fatalf("error reply: %v %v", r, err)
	}
	noResponders := &nats.Msg{Header: nats.Header{"Status": {"503"}}}
	if _, err := decodeReply("subj", noResponders); err != nats.ErrNoResponders {
		t.Fatalf("no responders: %v", err)
	}
	if _, err := decodeReply("subj", &nats.Msg{Data: []byte(`{"seq":`)}); err == nil || !strings.Contains(err.Error(), "subj") {
		t.Fatalf("malformed reply: %v", err)
	}
}

func BenchmarkParseEvent(b *testing.B) {
	raw := nodeEvent(b, 12345, session.KindOutput, session.OutputData{Turn: 3, Stream: "stdout", Text: strings.Repeat("some output ", 20)})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseEvent(raw, false); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeHistory(b *testing.B) {
	var events []json.RawMessage
	for i := range 1000 {
		events = append(events, nodeEvent(b, session.Seq(i+1), session.KindMessage, session.MessageData{Text: "a prompt of a realistic length, a sentence or so", ClientID: "c1"}))
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(session.Reply{Events: events, LastSeq: 5000, Epoch: "ep0ch", More: true}); err != nil {
		b.Fatal(err)
	}
	msg := &nats.Msg{Data: bytes.TrimSuffix(buf.Bytes(), []byte("\n"))}
	b.SetBytes(int64(len(msg.Data)))
	b.ReportAllocs()
	for b.Loop() {
		if r, err := decodeReply("subj", msg); err != nil || len(r.Events) != 1000 {
			b.Fatal(err)
		}
	}
}
