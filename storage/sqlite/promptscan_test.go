package sqlite

import (
	"testing"
)

// TestScanPrompt checks scanPrompt against decodePrompt: wherever the scan
// answers (ok), it answers as encoding/json does; the cases it must leave to
// the decoder are named.
func TestScanPrompt(t *testing.T) {
	type want struct {
		by, clientID       string
		hasBy, hasClientID bool
	}
	for _, c := range []struct {
		name     string
		in       string
		scanOK   bool // the scan answers itself
		expected want // what both must say (when the decode succeeds)
	}{
		{"node shape", `{"seq":12,"epoch":"e","time":"2026-01-02T03:04:05.000000000Z","kind":"message","by":"ann","data":{"text":"hi","client_id":"c-1"}}`,
			true, want{"ann", "c-1", true, true}},
		{"no client_id", `{"seq":1,"kind":"message","by":"ann","data":{"text":"hi"}}`, true, want{"ann", "", true, false}},
		{"empty client_id", `{"by":"ann","data":{"client_id":""}}`, true, want{"ann", "", true, true}},
		{"null client_id", `{"by":"ann","data":{"client_id":null}}`, true, want{"ann", "", true, false}},
		{"null data", `{"by":"ann","data":null}`, true, want{"ann", "", true, false}},
		{"no by", `{"seq":1,"data":{"client_id":"c"}}`, true, want{"", "c", false, true}},
		{"data before by, spaces", " { \"data\" : { \"client_id\" : \"c\" , \"n\" : [1, {\"x\": \"}\"}] } ,\n\"by\":\"bob\" } ", true, want{"bob", "c", true, true}},
		{"text with braces and quotes", `{"by":"ann","data":{"text":"a}\"{\\","client_id":"c-2","files":[{"p":"x"}],"n":-1.5e3,"t":true}}`,
			true, want{"ann", "c-2", true, true}},
		{"client_id in text only", `{"by":"ann","data":{"text":"\"client_id\":\"evil\""}}`, true, want{"ann", "", true, false}},
		{"nested client_id", `{"by":"ann","data":{"meta":{"client_id":"deep"}}}`, true, want{"ann", "", true, false}},
		{"unicode", `{"by":"zoë","data":{"client_id":"ид-1"}}`, true, want{"zoë", "ид-1", true, true}},
		{"escape in by", `{"by":"a\u006e","data":{"client_id":"c"}}`, false, want{"an", "c", true, true}},
		{"escape in client_id", `{"by":"ann","data":{"client_id":"c\"1"}}`, false, want{"ann", `c"1`, true, true}},
		{"repeated by", `{"by":"ann","by":"bob","data":{}}`, false, want{"bob", "", true, false}},
		{"repeated client_id", `{"by":"ann","data":{"client_id":"a","client_id":"b"}}`, false, want{"ann", "b", true, true}},
		{"escaped key", `{"b\u0079":"ann","data":{}}`, false, want{"ann", "", true, false}},
		{"by not a string", `{"by":7,"data":{}}`, false, want{}},
		{"truncated", `{"by":"ann","data":{"client_id":"c"`, false, want{}},
		{"trailing garbage", `{"by":"ann"} x`, false, want{}},
		{"not an object", `["by","ann"]`, false, want{}},
	} {
		by, cid, hasBy, hasCID, ok := scanPrompt([]byte(c.in))
		if ok != c.scanOK {
			t.Errorf("%s: scan ok = %v, want %v", c.name, ok, c.scanOK)
			continue
		}
		dby, dcid, dhasBy, dhasCID, dok := decodePrompt([]byte(c.in))
		if ok {
			if !dok {
				t.Errorf("%s: scan answered, decode failed", c.name)
				continue
			}
			if got := (want{by, cid, hasBy, hasCID}); got != c.expected {
				t.Errorf("%s: scan = %+v, want %+v", c.name, got, c.expected)
			}
		}
		if dok {
			if got := (want{dby, dcid, dhasBy, dhasCID}); got != c.expected {
				t.Errorf("%s: decode = %+v, want %+v", c.name, got, c.expected)
			}
		}
	}
}

func BenchmarkNotePrompt(b *testing.B) {
	ev := []byte(`{"seq":12345,"epoch":"01JXYZ","time":"2026-11-26T01:00:00.000000000Z","kind":"message","by":"bench","data":{"text":"append benchmark event","client_id":"abc-c3-12345"}}`)
	b.Run("scan", func(b *testing.B) {
		for b.Loop() {
			if _, _, _, _, ok := scanPrompt(ev); !ok {
				b.Fatal("scan failed")
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		for b.Loop() {
			if _, _, _, _, ok := decodePrompt(ev); !ok {
				b.Fatal("decode failed")
			}
		}
	})
}
