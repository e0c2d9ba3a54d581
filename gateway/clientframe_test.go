package gateway

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestScanPromptFrame: what scanPromptFrame reads is what encoding/json
// decodes, and it leaves every other shape to encoding/json.
func TestScanPromptFrame(t *testing.T) {
	for _, c := range []struct {
		frame string
		fast  bool
	}{
		{`{"type":"prompt","text":"hello","client_id":"c-1"}`, true},
		{`{"type":"prompt","text":"hello"}`, true},
		{` { "client_id" : "c" , "text" : "héllo ✓", "type" : "prompt" } `, true},
		{`{"type":"prompt","text":"","client_id":""}`, true},
		{`{"type":"prompt","text":"a\nb"}`, false},         // an escape
		{`{"type":"prompt","text":"a\u0041"}`, false},      // likewise
		{`{"type":"prompt","text":"<&>"}`, true},           // no escaping on decode
		{`{"type":"cancel"}`, false},                       // not a prompt
		{`{"type":"prompt"}`, false},                       // no text
		{`{"type":"prompt","text":"a","text":"b"}`, false}, // a repeated key: encoding/json keeps the last
		{`{"Type":"prompt","text":"a"}`, false},            // encoding/json matches keys case-insensitively
		{`{"type":"prompt","text":"a","id":"x"}`, false},
		{`{"type":"prompt","text":null}`, false},
		{`{"type":"prompt","text":"a"} x`, false},
		{`{"type":"prompt","text":"a"`, false},
		{`{"type":"prompt","text":"a",}`, false},
		{"{\"type\":\"prompt\",\"text\":\"\xff\"}", false}, // invalid UTF-8: encoding/json replaces it
		{"{\"type\":\"prompt\",\"text\":\"a\tb\"}", false}, // a raw control character is not JSON
		{`[]`, false},
		{``, false},
	} {
		text, cid, ok := scanPromptFrame([]byte(c.frame))
		if ok != c.fast {
			t.Errorf("%s: scanned %v, want %v", c.frame, ok, c.fast)
			continue
		}
		if !ok {
			continue
		}
		var f session.ClientFrame
		if err := json.Unmarshal([]byte(c.frame), &f); err != nil {
			t.Fatalf("%s: scanned, but encoding/json says %v", c.frame, err)
		}
		if f != (session.ClientFrame{Type: session.FramePrompt, Text: text, ClientID: cid}) {
			t.Errorf("%s: scanned text %q client_id %q, encoding/json %+v", c.frame, text, cid, f)
		}
	}
}

// TestAckFrame: ackFrame writes what encoding/json writes, whatever the
// client_id.
func TestAckFrame(t *testing.T) {
	for _, cid := range []string{"", "c-1", "lxyz-c3-1234", `a"b`, `a\b`, "<&>", "héllo", "a\nb", "\u2028", "\xff", "~ !#$%'()*+,-./:;=?@[]^_`{|}"} {
		want, err := json.Marshal(session.AckFrame{Type: session.FrameAck, ClientID: cid, Seq: 1234567})
		if err != nil {
			t.Fatal(err)
		}
		if got := ackFrame(cid, 1234567); !bytes.Equal(got, want) {
			t.Errorf("client_id %q:\n got %s\nwant %s", cid, got, want)
		}
	}
}
