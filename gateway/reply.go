package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats.go"
)

// decodeReply decodes the reply to a request on subj. A reply carrying an
// error returns that *session.Error; "no responders" returns
// nats.ErrNoResponders. The replies of the hot paths (a prompt's seq, a
// plain ok, a page of history) are read without encoding/json; anything
// else, or anything unexpected, is decoded by it.
func decodeReply(subj string, m *nats.Msg) (*session.Reply, error) {
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		return nil, nats.ErrNoResponders
	}
	if r, ok := scanReply(m.Data); ok {
		return r, nil
	}
	var reply session.Reply
	if err := json.Unmarshal(m.Data, &reply); err != nil {
		return nil, fmt.Errorf("decode reply from %s: %w", subj, err)
	}
	if reply.Error != nil {
		return nil, reply.Error
	}
	return &reply, nil
}

// scanReply reads a reply object whose members are only "seq", "events",
// "last_seq", "epoch", "more" and "results" (replies that scanReply reads),
// with the number and string values the node writes (no escapes in the
// epoch). Events are not validated or copied: they are the node's bytes,
// passed on as they are. It reports false for anything else.
func scanReply(b []byte) (*session.Reply, bool) {
	var r session.Reply
	b, ok := bytes.CutPrefix(b, []byte{'{'})
	if !ok {
		return nil, false
	}
	if len(b) == 1 && b[0] == '}' {
		return &r, true
	}
	for len(b) > 0 {
		var key []byte
		if key, b, ok = scanKey(b); !ok {
			return nil, false
		}
		switch string(key) {
		case "seq", "last_seq":
			i := 0
			for i < len(b) && b[i] >= '0' && b[i] <= '9' {
				i++
			}
			n, ok := parseDigits(b[:i])
			if !ok {
				return nil, false
			}
			if string(key) == "seq" {
				r.Seq = n
			} else {
				r.LastSeq = n
			}
			b = b[i:]
		case "epoch":
			if len(b) == 0 || b[0] != '"' {
				return nil, false
			}
			end := bytes.IndexByte(b[1:], '"') + 1
			if end == 0 || bytes.IndexByte(b[1:end], '\\') >= 0 {
				return nil, false
			}
			r.Epoch, b = string(b[1:end]), b[end+1:]
		case "more":
			if b, ok = bytes.CutPrefix(b, []byte("true")); !ok {
				return nil, false
			}
			r.More = true
		case "events":
			if b, ok = bytes.CutPrefix(b, []byte{'['}); !ok {
				return nil, false
			}
			for len(b) > 0 && b[0] != ']' {
				n := skipValue(b)
				if n == 0 || n == len(b) {
					return nil, false
				}
				r.Events = append(r.Events, json.RawMessage(b[:n:n]))
				b = b[n:]
				if b[0] == ',' {
					b = b[1:]
				}
			}
			if b, ok = bytes.CutPrefix(b, []byte{']'}); !ok {
				return nil, false
			}
		case "results":
			if b, ok = bytes.CutPrefix(b, []byte{'['}); !ok {
				return nil, false
			}
			for len(b) > 0 && b[0] != ']' {
				n := skipValue(b)
				if n == 0 || n == len(b) {
					return nil, false
				}
				res, ok := scanReply(b[:n])
				if !ok {
					return nil, false
				}
				r.Results = append(r.Results, *res)
				b = b[n:]
				if b[0] == ',' {
					b = b[1:]
				}
			}
			if b, ok = bytes.CutPrefix(b, []byte{']'}); !ok {
				return nil, false
			}
		default:
			return nil, false
		}
		switch {
		case len(b) == 1 && b[0] == '}':
			return &r, true
		case len(b) > 0 && b[0] == ',':
			b = b[1:]
		default:
			return nil, false
		}
	}
	return nil, false
}

// scanKey reads `"key":` without escapes.
func scanKey(b []byte) (key, rest []byte, ok bool) {
	if len(b) == 0 || b[0] != '"' {
		return nil, nil, false
	}
	end := bytes.IndexByte(b[1:], '"') + 1
	if end == 0 || end+1 >= len(b) || b[end+1] != ':' || bytes.IndexByte(b[1:end], '\\') >= 0 {
		return nil, nil, false
	}
	return b[1:end], b[end+2:], true
}

// skipValue returns the length of the JSON object, array, string or
// literal at the start of compact JSON b, or 0 if b does not start with a
// complete one. It does not validate what it skips.
func skipValue(b []byte) int {
	depth := 0
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if i >= len(b) {
				return 0
			}
			if depth == 0 {
				return i + 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i // the end of a literal before the enclosing bracket
			}
			if depth--; depth == 0 {
				return i + 1
			}
		case ',':
			if depth == 0 {
				return i
			}
		}
	}
	return 0
}

// parseDigits parses a positive decimal number of at most 18 digits with no
// leading zero.
func parseDigits(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 18 || b[0] == '0' {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}
