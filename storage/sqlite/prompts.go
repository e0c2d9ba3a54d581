package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"unicode/utf8"

	"github.com/atriumhq/atrium/session"
)

// promptSetAfter is how many PromptSeq calls a Log answers from SQL before
// it builds its promptSet. A session woken for one retried prompt reads no
// more than that one lookup; a busy one, past its actor's memory of recent
// prompts, asks on every prompt and is better served from memory.
const promptSetAfter = 16

// promptSet holds a hash of (by, client_id) of every message event of a
// history. Its negative answers are exact, so PromptSeq answers "no such
// prompt" (the common case: a new client_id) without SQL; a positive one,
// true or a hash collision, is checked in the events_prompt index.
type promptSet struct {
	seed   maphash.Seed
	hashes map[uint64]struct{}
}

func (p *promptSet) key(by, clientID string) uint64 {
	var h maphash.Hash
	h.SetSeed(p.seed)
	h.WriteString(by)
	h.WriteByte(0)
	h.WriteString(clientID)
	return h.Sum64()
}

func (p *promptSet) has(by, clientID string) bool {
	_, ok := p.hashes[p.key(by, clientID)]
	return ok
}

func (p *promptSet) add(by, clientID string) { p.hashes[p.key(by, clientID)] = struct{}{} }

// loadPromptSetLocked builds l.prompts from the events_prompt index. l.mu
// must be held, so no Append runs meanwhile.
func (l *Log) loadPromptSetLocked(ctx context.Context) error {
	rows, err := l.writer.QueryContext(ctx, `SELECT prompt_by, prompt_client_id FROM events INDEXED BY events_prompt
		WHERE prompt_client_id IS NOT NULL`)
	if err != nil {
		return fmt.Errorf("load prompts: %w", err)
	}
	defer rows.Close()
	p := &promptSet{seed: maphash.MakeSeed(), hashes: make(map[uint64]struct{})}
	for rows.Next() {
		var by, clientID any
		if err := rows.Scan(&by, &clientID); err != nil {
			return fmt.Errorf("load prompts: %w", err)
		}
		b, ok1 := by.(string)
		c, ok2 := clientID.(string)
		if !ok1 || !ok2 {
			// Not as the actor writes them: leave every lookup to SQL.
			return nil
		}
		p.add(b, c)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("load prompts: %w", err)
	}
	l.prompts = p
	return nil
}

// prompt is what the events_prompt index holds of an event (readPrompts).
type prompt struct {
	by, clientID        string
	hasBy, hasClientID  bool
	message, unreadable bool // a message event; one that is not a JSON object
}

// indexed reports whether the event is in the events_prompt index: a
// message with a by and a data.client_id, both strings.
func (p prompt) indexed() bool { return p.message && p.hasBy && p.hasClientID }

// readPrompts reads by and data.client_id of each message event of evs.
func readPrompts(evs []session.Stored) []prompt {
	ps := make([]prompt, len(evs))
	for i, ev := range evs {
		if ev.Kind != session.KindMessage {
			continue
		}
		p := &ps[i]
		p.message = true
		var ok bool
		p.by, p.clientID, p.hasBy, p.hasClientID, ok = scanPrompt(ev.JSON)
		if !ok {
			p.by, p.clientID, p.hasBy, p.hasClientID, ok = decodePrompt(ev.JSON)
		}
		p.unreadable = !ok
	}
	return ps
}

// notePromptsLocked adds the prompts of a committed batch (readPrompts) to
// l.prompts. A message without a by (or not a JSON object) drops the set,
// and lookups go to SQL again. l.mu must be held.
func (l *Log) notePromptsLocked(ps []prompt) {
	if l.prompts == nil {
		return
	}
	for _, p := range ps {
		if !p.message {
			continue
		}
		if p.unreadable || !p.hasBy {
			l.prompts = nil
			return
		}
		if p.hasClientID {
			l.prompts.add(p.by, p.clientID)
		}
	}
}

// decodePrompt reads a message event's by and data.client_id with
// encoding/json; ok is false when b is not a JSON object.
func decodePrompt(b []byte) (by, clientID string, hasBy, hasClientID, ok bool) {
	var m struct {
		By   *string `json:"by"`
		Data struct {
			ClientID *string `json:"client_id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return "", "", false, false, false
	}
	if m.By != nil {
		by, hasBy = *m.By, true
	}
	if m.Data.ClientID != nil {
		clientID, hasClientID = *m.Data.ClientID, true
	}
	return by, clientID, hasBy, hasClientID, true
}

// scanPrompt is decodePrompt without encoding/json, for the events the
// node writes (a JSON object, keys without escapes, each once). It walks
// the object's keys and skips the values it does not need; ok is false for
// anything else it meets (an escape in a string it needs, a repeated key,
// a malformed value), and the caller then decodes. A client_id or by that
// is null counts as absent, as with decodePrompt.
func scanPrompt(b []byte) (by, clientID string, hasBy, hasClientID, ok bool) {
	sc := jscan{b: b}
	seenBy, seenData := false, false
	ok = sc.object(func(key []byte) bool {
		switch string(key) {
		case "by":
			if seenBy {
				return false
			}
			seenBy = true
			v, isStr, ok := sc.plainStringOrNull()
			by, hasBy = v, isStr
			return ok
		case "data":
			if seenData {
				return false
			}
			seenData = true
			sc.space()
			if sc.i < len(sc.b) && sc.b[sc.i] != '{' {
				// Not an object: no data.client_id for the index
				// either.
				return sc.skip()
			}
			seenCID := false
			return sc.object(func(key []byte) bool {
				if string(key) != "client_id" {
					return sc.skip()
				}
				if seenCID {
					return false
				}
				seenCID = true
				v, isStr, ok := sc.plainStringOrNull()
				clientID, hasClientID = v, isStr
				return ok
			})
		}
		return sc.skip()
	})
	if ok {
		sc.space()
		ok = sc.i == len(sc.b)
	}
	return by, clientID, hasBy, hasClientID, ok
}

// jscan is a minimal JSON reader over b from i.
type jscan struct {
	b []byte
	i int
}

func (s *jscan) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// object reads an object, calling field for each key with the reader at
// the key's value (after the colon); field reads the value.
func (s *jscan) object(field func(key []byte) bool) bool {
	s.space()
	if s.i >= len(s.b) || s.b[s.i] != '{' {
		return false
	}
	s.i++
	s.space()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return true
	}
	for {
		s.space()
		key, plain, ok := s.str()
		if !ok || !plain {
			return false
		}
		s.space()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return false
		}
		s.i++
		if !field(key) {
			return false
		}
		s.space()
		if s.i >= len(s.b) {
			return false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			return true
		default:
			return false
		}
	}
}

// str reads a string and returns its raw bytes; plain is false when it
// holds an escape (its bytes are then not its value).
func (s *jscan) str() (raw []byte, plain, ok bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false, false
	}
	start := s.i + 1
	plain = true
	for j := start; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '\\':
			plain = false
			j++
		case c == '"':
			s.i = j + 1
			return s.b[start:j], plain, true
		case c < 0x20:
			return nil, false, false
		}
	}
	return nil, false, false
}

// plainStringOrNull reads a value that must be a string without escapes
// (isStr) or null.
func (s *jscan) plainStringOrNull() (v string, isStr, ok bool) {
	s.space()
	if bytes.HasPrefix(s.b[s.i:], []byte("null")) {
		s.i += 4
		return "", false, true
	}
	raw, plain, ok := s.str()
	if !ok || !plain || !utf8.Valid(raw) {
		return "", false, false
	}
	return string(raw), true, true
}

// skip reads any value; nested objects and arrays are matched by their
// brackets outside strings, and their contents are checked no further
// than that (encoding/json checks them when the caller falls back).
func (s *jscan) skip() bool {
	s.space()
	if s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '"':
		_, _, ok := s.str()
		return ok
	case c == '{' || c == '[':
		depth := 0
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case '"':
				if _, _, ok := s.str(); !ok {
					return false
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					s.i++
					return true
				}
			}
			s.i++
		}
		return false
	default: // number, true, false, null
		start := s.i
		for s.i < len(s.b) && (s.b[s.i] == '-' || s.b[s.i] == '+' || s.b[s.i] == '.' || (s.b[s.i] >= '0' && s.b[s.i] <= '9') ||
			(s.b[s.i] >= 'a' && s.b[s.i] <= 'z') || (s.b[s.i] >= 'A' && s.b[s.i] <= 'Z')) {
			s.i++
		}
		return s.i > start
	}
}

// promptLookup returns PromptSeq's prepared statement, or nil when the
// prompt set says that user never sent clientID. It builds the set once
// PromptSeq has been called promptSetAfter times.
func (l *Log) promptLookup(ctx context.Context, user, clientID string) (*sql.Stmt, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, errors.New("closed")
	}
	l.lookups++
	if l.prompts == nil && l.lookups == promptSetAfter {
		if err := l.loadPromptSetLocked(ctx); err != nil {
			return nil, err
		}
	}
	if l.prompts != nil && !l.prompts.has(user, clientID) {
		return nil, nil
	}
	if l.prompt == nil {
		st, err := l.writer.PrepareContext(ctx, promptQuery)
		if err != nil {
			return nil, fmt.Errorf("prepare prompt lookup: %w", err)
		}
		l.prompt = st
	}
	return l.prompt, nil
}
