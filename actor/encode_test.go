package actor

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

// stdEncode is what encoding/json writes for v without HTML escaping.
func stdEncode(t *testing.T, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'})
}

func encodeStrings() []string {
	ss := []string{
		"", "plain", `quote " and \ backslash`, "<b>&amp;</b>", "tab\tnew\nline\rcr\bbs\fff",
		"\x00\x01\x1f\x7f", "héllo wörld ✓ 🙂", "line\u2028para\u2029end", "bad \xff\xfe utf8 \xe2\x82",
		"trailing \xc3", "\u00a0\ufeff",
	}
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "\"", "\\", "\n", "\x01", "é", "\u2028", "\xff", "🙂", "<", " ", "\x7f", "\xe2\x82"}
	for range 500 {
		var b []byte
		for range r.IntN(20) {
			b = append(b, alphabet[r.IntN(len(alphabet))]...)
		}
		ss = append(ss, string(b))
	}
	return ss
}

// TestEncode_MatchesEncodingJSON checks that the hand-written encoders write
// exactly what encoding/json writes, so events stay byte for byte the same
// whichever wrote them.
func TestEncode_MatchesEncodingJSON(t *testing.T) {
	times := []time.Time{
		time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
		time.Date(1999, 12, 31, 23, 59, 59, 999999999, time.FixedZone("x", -7*3600)),
		time.Date(2026, 6, 1, 0, 0, 0, 0, time.Local),
		time.Unix(0, 0),
		time.Now(),
	}
	for i, s := range encodeStrings() {
		tm := times[i%len(times)]
		data := stdEncode(t, session.MessageData{Text: s, ClientID: s})
		if got := messageData(s, s); !bytes.Equal(got, data) {
			t.Fatalf("messageData(%q):\n got %s\nwant %s", s, got, data)
		}
		want := stdEncode(t, session.Event{Seq: int64(i) * 7919, Epoch: s, Time: session.Time{Time: tm},
			Kind: session.Kind(s), By: s, Data: data})
		if got := encodeEvent(int64(i)*7919, s, tm, session.Kind(s), s, data); !bytes.Equal(got.JSON, want) {
			t.Fatalf("event with %q:\n got %s\nwant %s", s, got.JSON, want)
		}
	}
	for _, rep := range []session.Reply{
		{}, {Seq: 1}, {Seq: 1 << 50}, {Error: session.Errorf(session.CodeConflict, "a <b> \"c\"")},
		{Events: []json.RawMessage{json.RawMessage(`{"a":"<&>"}`)}, LastSeq: 3, Epoch: "e", More: true},
		{Events: []json.RawMessage{json.RawMessage(`{"seq":1}`), json.RawMessage(`{"seq":2,"t":"\u2028 \"x\""}`)}},
		{Events: []json.RawMessage{json.RawMessage(`{"seq":1}`)}, LastSeq: 1},
		{Seq: 4, Events: []json.RawMessage{json.RawMessage(`{"seq":1}`)}, Epoch: "e"},
		{Session: &session.Session{ID: "s_1", Title: "<t>"}},
		{Results: []session.Reply{{Seq: 7}, {Error: session.Errorf(session.CodeBadRequest, "a <b>")}, {Seq: 9}}},
		{Results: []session.Reply{{Seq: 1}}},
		{Results: []session.Reply{{Seq: 1}}, LastSeq: 2},
	} {
		if got, want := encodeReply(&rep), stdEncode(t, rep); !bytes.Equal(got, want) {
			t.Errorf("reply %+v:\n got %s\nwant %s", rep, got, want)
		}
	}
}

func BenchmarkEncodeEvent(b *testing.B) {
	data := messageData("some prompt text of a realistic length, say a sentence or two long.", "c-123")
	now := time.Now()
	b.ReportAllocs()
	for i := range b.N {
		encodeEvent(int64(i), "abcdefgh", now, session.KindMessage, "alice", data)
	}
}
