package gateway

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/atriumhq/atrium/session"
)

// The prompt path reads every prompt frame and writes every ack; these two
// skip encoding/json's reflection for the shapes clients send and the
// client_ids they use, and leave anything else to it, with the same result.

// scanPromptFrame reads a prompt frame of the plain shape: a JSON object
// whose members are "type" (equal to "prompt"), "text" and, optionally,
// "client_id", each once, as strings without escapes, in valid UTF-8. ok is
// false for anything else, which the caller decodes with encoding/json;
// when ok, the result is what encoding/json would decode.
func scanPromptFrame(b []byte) (text, clientID string, ok bool) {
	var seenType, seenText, seenCID bool
	b = trimSpace(b)
	b, ok = bytes.CutPrefix(b, []byte{'{'})
	if !ok {
		return "", "", false
	}
	for {
		b = trimSpace(b)
		key, rest, ok := plainString(b)
		if !ok {
			return "", "", false
		}
		rest = trimSpace(rest)
		if rest, ok = bytes.CutPrefix(rest, []byte{':'}); !ok {
			return "", "", false
		}
		val, rest, ok := plainString(trimSpace(rest))
		if !ok {
			return "", "", false
		}
		switch string(key) {
		case "type":
			if seenType || string(val) != session.FramePrompt {
				return "", "", false
			}
			seenType = true
		case "text":
			if seenText {
				return "", "", false
			}
			seenText, text = true, string(val)
		case "client_id":
			if seenCID {
				return "", "", false
			}
			seenCID, clientID = true, string(val)
		default:
			return "", "", false
		}
		b = trimSpace(rest)
		if len(b) == 0 {
			return "", "", false
		}
		switch b[0] {
		case ',':
			b = b[1:]
		case '}':
			if len(trimSpace(b[1:])) != 0 || !seenType || !seenText {
				return "", "", false
			}
			return text, clientID, true
		default:
			return "", "", false
		}
	}
}

// plainString reads a JSON string without escapes or control characters,
// in valid UTF-8, at the start of b, and returns its contents and what
// follows it.
func plainString(b []byte) (s, rest []byte, ok bool) {
	if len(b) == 0 || b[0] != '"' {
		return nil, nil, false
	}
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			if !utf8.Valid(b[1:i]) {
				return nil, nil, false
			}
			return b[1:i], b[i+1:], true
		case c == '\\' || c < 0x20:
			return nil, nil, false
		}
	}
	return nil, nil, false
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\n' || b[0] == '\r') {
		b = b[1:]
	}
	return b
}

// ackFrame encodes session.AckFrame{clientID, seq} as encoding/json does.
func ackFrame(clientID string, seq session.Seq) []byte {
	for i := 0; i < len(clientID); i++ {
		if c := clientID[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(session.AckFrame{Type: session.FrameAck, ClientID: clientID, Seq: seq})
			return b
		}
	}
	b := make([]byte, 0, len(`{"type":"ack","client_id":"","seq":}`)+len(clientID)+20)
	b = append(b, `{"type":"`...)
	b = append(b, session.FrameAck...)
	b = append(b, `","client_id":"`...)
	b = append(b, clientID...)
	b = append(b, `","seq":`...)
	b = strconv.AppendInt(b, seq, 10)
	return append(b, '}')
}
