package actor

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/atriumhq/atrium/session"
)

// The encoders below write exactly what encoding/json writes for the same
// values with HTML escaping off (encode_test.go checks it), without its
// reflection, buffers and re-validation of raw data. They run for every
// event and every reply.

// appendEvent appends the encoding of session.Event{seq, epoch, t, kind, by,
// data} to b. data must be compact JSON (what mustMarshal and
// session.AgentData produce).
func appendEvent(b []byte, seq session.Seq, epoch string, t time.Time, kind session.Kind, by string, data json.RawMessage) []byte {
	b = append(b, `{"seq":`...)
	b = strconv.AppendInt(b, seq, 10)
	b = append(b, `,"epoch":`...)
	b = appendString(b, epoch)
	b = append(b, `,"time":"`...)
	b = appendTime(b, t)
	b = append(b, `","kind":`...)
	b = appendString(b, string(kind))
	b = append(b, `,"by":`...)
	b = appendString(b, by)
	b = append(b, `,"data":`...)
	if len(data) == 0 {
		b = append(b, "null"...)
	} else {
		b = append(b, data...)
	}
	return append(b, '}')
}

// messageData encodes session.MessageData{text, clientID}.
func messageData(text, clientID string) []byte {
	b := make([]byte, 0, len(text)+len(clientID)+32)
	b = append(b, `{"text":`...)
	b = appendString(b, text)
	b = append(b, `,"client_id":`...)
	b = appendString(b, clientID)
	return append(b, '}')
}

// encodeReply encodes rep without HTML escaping, so events in a history
// reply keep the exact bytes that were stored and published. The replies of
// the hot path (a prompt's seq, a plain ok) skip encoding/json.
func encodeReply(rep *session.Reply) []byte {
	if rep.Error == nil && rep.Session == nil && rep.Events == nil && rep.LastSeq == 0 && rep.Epoch == "" && !rep.More && rep.Secrets == nil &&
		rep.Files == nil && rep.Fork == nil && rep.Results == nil {
		if rep.Seq == 0 {
			return []byte("{}")
		}
		b := make([]byte, 0, 32)
		b = append(b, `{"seq":`...)
		b = strconv.AppendInt(b, rep.Seq, 10)
		return append(b, '}')
	}
	if len(rep.Events) > 0 && rep.Error == nil && rep.Seq == 0 && rep.Session == nil {
		return encodeHistoryReply(rep)
	}
	if len(rep.Results) > 0 && rep.Error == nil && rep.Seq == 0 && rep.Session == nil && rep.Events == nil &&
		rep.LastSeq == 0 && rep.Epoch == "" && !rep.More && rep.Secrets == nil && rep.Files == nil && rep.Fork == nil {
		return encodeResults(rep.Results)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(rep); err != nil {
		return encodeReply(&session.Reply{Error: session.AsError(err)})
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'})
}

// encodeHistoryReply encodes a reply whose first member is events (the
// fields before it are empty) by copying the events' stored bytes, which the
// node wrote compact, instead of having encoding/json re-scan and compact
// each one: on a history page that was most of the reply's cost. The rest of
// the reply is encoded as usual; the result is what encoding/json writes.
func encodeHistoryReply(rep *session.Reply) []byte {
	r := *rep
	r.Events = nil
	rest := encodeReply(&r) // "{}" or {"last_seq":…,…}
	n := len(`{"events":[]}`) + len(rest)
	for _, ev := range rep.Events {
		n += len(ev) + 1
	}
	b := make([]byte, 0, n)
	b = append(b, `{"events":[`...)
	for i, ev := range rep.Events {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, ev...)
	}
	b = append(b, ']')
	if len(rest) > 2 {
		b = append(b, ',')
		return append(b, rest[1:]...)
	}
	return append(b, '}')
}

// encodeResults encodes the reply to OpPrompts, {"results":[…]}, each
// result as encodeReply encodes it.
func encodeResults(results []session.Reply) []byte {
	b := make([]byte, 0, 16+24*len(results))
	b = append(b, `{"results":[`...)
	for i := range results {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, encodeReply(&results[i])...)
	}
	return append(b, ']', '}')
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string the way encoding/json does with
// HTML escaping off: control characters escaped, invalid UTF-8 replaced by
// U+FFFD, U+2028 and U+2029 escaped.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendTime appends t in session.TimeLayout, in UTC.
func appendTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(b, session.TimeLayout)
	}
	hour, min, sec := t.Clock()
	b = appendDigits(b, year, 4)
	b = append(b, '-')
	b = appendDigits(b, int(month), 2)
	b = append(b, '-')
	b = appendDigits(b, day, 2)
	b = append(b, 'T')
	b = appendDigits(b, hour, 2)
	b = append(b, ':')
	b = appendDigits(b, min, 2)
	b = append(b, ':')
	b = appendDigits(b, sec, 2)
	b = append(b, '.')
	b = appendDigits(b, t.Nanosecond(), 9)
	return append(b, 'Z')
}

// appendDigits appends the n lowest decimal digits of v, zero-padded.
func appendDigits(b []byte, v, n int) []byte {
	b = append(b, make([]byte, n)...)
	for i := len(b) - 1; i >= len(b)-n; i-- {
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return b
}
