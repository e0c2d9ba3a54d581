package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"

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
	rows, err := l.writer.QueryContext(ctx, `SELECT `+promptBy+`, `+promptClientID+` FROM events INDEXED BY events_prompt
		WHERE kind = 'message' AND `+promptClientID+` IS NOT NULL`)
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

// notePromptsLocked adds the message events of a committed batch to
// l.prompts. A message it cannot read as the index does drops the set, and
// lookups go to SQL again. l.mu must be held.
func (l *Log) notePromptsLocked(evs []session.Stored) {
	if l.prompts == nil {
		return
	}
	for _, ev := range evs {
		if ev.Kind != session.KindMessage {
			continue
		}
		var m struct {
			By   *string `json:"by"`
			Data struct {
				ClientID *string `json:"client_id"`
			} `json:"data"`
		}
		if err := json.Unmarshal(ev.JSON, &m); err != nil || m.By == nil {
			l.prompts = nil
			return
		}
		if m.Data.ClientID != nil {
			l.prompts.add(*m.By, *m.Data.ClientID)
		}
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
