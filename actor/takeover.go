package actor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	ajs "github.com/atriumhq/atrium/actor/jetstream"
	"github.com/atriumhq/atrium/session"
)

// Takeover (DESIGN §4). With its lease held, an activating session compares
// its local history file with the events stream before serving:
//
//   - The stream's last event for the session is also in the file, byte for
//     byte: the file is current (the fast path of a session waking on the
//     node it hibernated on: one stream lookup and one indexed read). Events
//     after it in the file were committed but their capture never confirmed
//     (their senders were never acknowledged): they are re-published, with
//     the same Nats-Msg-Id, so they keep their seqs and every watcher that
//     saw them live saw the truth.
//   - The file is behind the stream (another node wrote since): the stream
//     is replayed into it, if it still holds every event after the file's
//     last.
//   - The file disagrees with the stream (this node's un-acknowledged tail,
//     when another node has written those seqs since), or the stream no
//     longer reaches back to the file's end, or there is no file: the newest
//     checkpoint is restored and the stream replayed after it. Without a
//     checkpoint the file is rebuilt from the stream if it holds the whole
//     session (metadata from the session's Meta subject).
//
// seq then continues after the last event, with no gap and no reuse.

// errReplayGap means the stream lacks events a replay needed.
var errReplayGap = errors.New("the events stream no longer holds every event needed")

// errDiverged means the local history's last event is not the stream's
// event of that seq.
var errDiverged = errors.New("the local history diverged from the events stream")

// bringUpToDate opens id's history, making it agree with the events stream
// first (see above).
func (o *opener) bringUpToDate(ctx context.Context, continued bool) (History, error) {
	hist, err := o.syncWithStream(ctx, continued)
	if err != nil {
		return hist, err
	}
	o.h.markCurrent(o.id)
	if err := o.sayStoreFullStop(ctx, hist); err != nil {
		return nil, err
	}
	return hist, nil
}

// syncWithStream opens id's history and makes it agree with the events
// stream (see above).
func (o *opener) syncWithStream(ctx context.Context, continued bool) (History, error) {
	h := o.h
	if continued {
		// This node released the lease last and nobody held it since:
		// everything it committed was captured before it let go, so the
		// file is current. The fast path of waking: no stream lookup.
		hist, err := o.openLocal(ctx)
		if err == nil || !errors.Is(err, session.ErrNotFound) {
			return hist, err
		}
	}
	if err := h.storeFull(); err != nil {
		// The stream may not even answer reads while its disk is full (a
		// write stuck holding it): refuse at once, saying why.
		return nil, unavailableFor(err, "session %s cannot be compared with the events stream: %v; retry", o.id, err)
	}
	last, err := h.streamLast(ctx, h.cfg.Subjects.Events(o.id))
	if err != nil {
		return nil, session.Errorf(session.CodeUnavailable, "%v", err)
	}
	if last != nil && isControl(last.Header) {
		if session.ControlKind(last.Header.Get(session.HeaderControl)) == session.ControlDeleted {
			return nil, session.Errorf(session.CodeNotFound, "session %s not found", o.id)
		}
		last = nil // Not an event; nothing to compare.
	}
	hist, err := h.cfg.Histories.Open(ctx, o.id)
	if err != nil && !errors.Is(err, session.ErrNotFound) {
		return nil, err
	}
	if err == nil {
		ok, err := o.reconcile(ctx, hist, last)
		if ok || err != nil {
			if err != nil {
				hist.Close()
			}
			return hist, err
		}
		hist.Close()
	}
	return o.restore(ctx, last)
}

// storeFullSaidWithin bounds how long after a stop for a full store its
// error event is still written (sayStoreFullStop).
const storeFullSaidWithin = time.Hour

// sayStoreFullStop records, in an error event after the last, that the
// session stopped on this node because the JetStream store was full, if it
// did: the prompts sent meanwhile were refused, and a reader of the history
// sees why. A stop older than storeFullSaidWithin is not said: the session
// may have been served elsewhere since.
func (o *opener) sayStoreFullStop(ctx context.Context, hist History) error {
	v, ok := o.h.storeFullStops.LoadAndDelete(o.id)
	if !ok || hist == nil {
		return nil
	}
	stop := v.(storeFullStop)
	if time.Since(stop.at) > storeFullSaidWithin {
		return nil
	}
	m, err := hist.Meta(ctx)
	if err == nil {
		var last session.Seq
		if last, err = hist.LastSeq(ctx); err == nil {
			ev := encodeEvent(last+1, m.Epoch, time.Now().UTC(), session.KindError, session.BySystem, mustMarshal(session.ErrorData{
				Code: session.CodeUnavailable,
				Message: fmt.Sprintf("from %s this session's events could not be stored (%s); prompts sent until now were refused and can be sent again",
					stop.at.UTC().Format(time.RFC3339), stop.why),
			}))
			if err = hist.Append(ctx, []session.Stored{ev}); err == nil {
				if _, err = o.h.captureEvents(ctx, o.id, m.Epoch, []session.Stored{ev}, nil); err != nil {
					err = session.Errorf(session.CodeUnavailable, "record the full store: %v", err)
				}
			}
		}
	}
	if err != nil {
		hist.Close()
		return err
	}
	return nil
}

// reconcile brings an open local history up to date with the stream whose
// last event is last (nil: the stream has none). ok false means the file
// cannot be trusted: restore instead.
func (o *opener) reconcile(ctx context.Context, hist History, last *jetstream.RawStreamMsg) (ok bool, err error) {
	local, err := hist.LastSeq(ctx)
	if err != nil {
		return false, err
	}
	if last == nil {
		// The stream has nothing of the session (it predates the stream,
		// or the stream aged it out): a checkpoint newer than the file
		// means another node owned it since.
		if o.h.cfg.Checkpoints != nil {
			m, _, err := o.h.readCheckpoint(ctx, o.id)
			if err != nil {
				return false, session.Errorf(session.CodeUnavailable, "%v", err)
			}
			if m != nil && m.LastSeq > local {
				return false, nil
			}
		}
		return true, nil
	}
	streamSeq, err := seqOf(last.Data)
	if err != nil {
		return false, fmt.Errorf("last event in the stream: %w", err)
	}
	if local < streamSeq {
		// The file's last event must be the stream's event of that seq:
		// if this node committed it while losing its lease, another node
		// may have written a different one since.
		var mine []byte
		if local > 0 {
			evs, _, err := hist.Range(ctx, local-1, 1, 0)
			if err != nil {
				return false, err
			}
			if len(evs) == 1 {
				mine = evs[0]
			}
		}
		err := o.replay(ctx, hist, local, 1, last.Sequence, mine)
		switch {
		case errors.Is(err, errReplayGap):
			o.log.Info("local history is behind the stream's reach; restoring the checkpoint", "last_seq", local, "stream_seq", streamSeq)
			return false, nil
		case errors.Is(err, errDiverged):
			o.log.Warn("local history disagrees with the stream (another node wrote since); restoring the checkpoint",
				"last_seq", local, "stream_seq", streamSeq)
			return false, nil
		case err != nil:
			return false, err
		}
		if now, err := hist.LastSeq(ctx); err != nil || now < streamSeq {
			if err != nil {
				return false, err
			}
			o.log.Warn("the replay stopped short of the stream's last event; restoring the checkpoint",
				"last_seq", now, "stream_seq", streamSeq)
			return false, nil
		}
		return true, nil
	}
	evs, _, err := hist.Range(ctx, streamSeq-1, 1, 0)
	if err != nil {
		return false, err
	}
	if len(evs) != 1 || !bytes.Equal(evs[0], last.Data) {
		o.log.Warn("local history disagrees with the stream (another node wrote since); restoring the checkpoint",
			"last_seq", local, "stream_seq", streamSeq)
		return false, nil
	}
	if local > streamSeq {
		if err := o.republish(ctx, hist, streamSeq, local); err != nil {
			if errors.Is(err, errDiverged) {
				o.log.Warn("local history disagrees with the stream (another node wrote since); restoring the checkpoint",
					"last_seq", local, "stream_seq", streamSeq)
				return false, nil
			}
			return false, err
		}
	}
	return true, nil
}

// republish captures the events after seq from through to of hist: committed
// here but never confirmed by the stream.
func (o *opener) republish(ctx context.Context, hist History, from, to session.Seq) error {
	m, err := hist.Meta(ctx)
	if err != nil {
		return err
	}
	o.log.Info("re-publishing events whose capture was never confirmed", "from", from+1, "to", to)
	for after := from; after < to; {
		raws, _, err := hist.Range(ctx, after, maxBatch, session.DefaultHistoryMaxBytes)
		if err != nil || len(raws) == 0 {
			return fmt.Errorf("read events to re-publish: %v", err)
		}
		evs := make([]session.Stored, 0, len(raws))
		for _, raw := range raws {
			seq, err := seqOf(raw)
			if err != nil {
				return err
			}
			evs = append(evs, session.Stored{Seq: seq, JSON: raw})
			after = seq
		}
		if _, err := o.h.captureEvents(ctx, o.id, m.Epoch, evs, nil); err != nil {
			if errors.Is(err, errSeqTaken) {
				// The stream has another event under one of these seqs
				// (a read of its end that lagged behind another owner's
				// writes): this file diverged.
				return fmt.Errorf("re-publish events: %w", errDiverged)
			}
			return unavailableFor(err, "re-publish events: %v", err)
		}
	}
	return nil
}

// restore makes id's local history from the newest checkpoint, or from the
// stream alone, then replays the stream after it.
func (o *opener) restore(ctx context.Context, last *jetstream.RawStreamMsg) (History, error) {
	h := o.h
	var m *checkpointManifest
	if h.cfg.Checkpoints != nil {
		var err error
		if m, _, err = h.readCheckpoint(ctx, o.id); err != nil {
			return nil, session.Errorf(session.CodeUnavailable, "%v", err)
		}
	}
	var start uint64 = 1
	switch {
	case m != nil:
		if err := h.restoreCheckpoint(ctx, o.id, m); err != nil {
			return nil, session.Errorf(session.CodeUnavailable, "%v", err)
		}
		start = m.StreamSeq + 1
		o.log.Info("restored checkpoint", "last_seq", m.LastSeq, "fence", m.Fence, "node", m.Node)
	case last != nil:
		metaMsg, err := h.streamLast(ctx, h.cfg.Subjects.Meta(o.id))
		if err != nil {
			return nil, session.Errorf(session.CodeUnavailable, "%v", err)
		}
		if metaMsg == nil {
			return nil, session.Errorf(session.CodeUnavailable, "session %s has events in the stream but no metadata and no checkpoint", o.id)
		}
		var meta session.Meta
		if err := json.Unmarshal(metaMsg.Data, &meta); err != nil || meta.ID != o.id {
			return nil, session.Errorf(session.CodeInternal, "session %s: metadata in the stream does not decode (%v)", o.id, err)
		}
		if err := h.cfg.Histories.Remove(ctx, o.id); err != nil {
			return nil, err
		}
		hist, err := h.cfg.Histories.Create(ctx, meta)
		if err != nil {
			return nil, err
		}
		hist.Close()
		o.log.Info("rebuilding history from the events stream")
	default:
		return nil, session.Errorf(session.CodeNotFound, "session %s not found", o.id)
	}
	hist, err := h.cfg.Histories.Open(ctx, o.id)
	if err != nil {
		return nil, err
	}
	local, err := hist.LastSeq(ctx)
	if err == nil {
		var want uint64
		if last != nil {
			want = last.Sequence
		}
		err = o.replay(ctx, hist, local, start, want, nil)
	}
	if errors.Is(err, errReplayGap) {
		err = session.Errorf(session.CodeUnavailable, "session %s cannot be restored: %v after seq %d", o.id, err, local)
	}
	if err != nil {
		hist.Close()
		return nil, err
	}
	return hist, nil
}

// replay appends to hist the session's events after seq base that the
// stream holds from sequence start on, and the newest metadata among them.
// Messages may be out of order (retried captures) or repeated (the first
// copy of a seq counts, as it did for every replay before); events are
// applied in seq order and must follow base without a gap (errReplayGap).
// If mine is not nil, the stream's event base, when it still holds it,
// must be mine byte for byte (errDiverged). The replay reads at least up to
// stream sequence want, the newest message of the session the caller has
// seen: its own look at the stream's end is a direct get, which a lagging
// replica may answer with an older message, and stopping there would take
// a file for current that is not.
func (o *opener) replay(ctx context.Context, hist History, base session.Seq, start, want uint64, mine []byte) error {
	h := o.h
	evSubj, metaSubj := h.cfg.Subjects.Events(o.id), h.cfg.Subjects.Meta(o.id)
	target := want
	for _, subj := range []string{evSubj, metaSubj} {
		m, err := h.streamLast(ctx, subj)
		if err != nil {
			return session.Errorf(session.CodeUnavailable, "%v", err)
		}
		if m != nil {
			target = max(target, m.Sequence)
		}
	}
	if target < start {
		return nil
	}
	pending := map[session.Seq][]byte{}
	var meta []byte
	var top session.Seq
	checked := false // the stream's first copy of seq base was compared with mine
	var stop error   // why the callback ended the replay
	err := h.events.Replay(ctx, []string{evSubj, metaSubj}, start, target, func(msg ajs.Msg) error {
		switch {
		case msg.Subject == metaSubj:
			meta = msg.Data
		case isControl(msg.Header):
		default:
			seq, err := seqOf(msg.Data)
			if err != nil {
				stop = fmt.Errorf("replay the events stream: stream sequence %d: %w", msg.StreamSeq, err)
				return stop
			}
			if _, dup := pending[seq]; seq > base && !dup {
				pending[seq] = msg.Data
				top = max(top, seq)
			}
			if seq == base && mine != nil && !checked {
				checked = true
				if !bytes.Equal(msg.Data, mine) {
					stop = fmt.Errorf("%w at seq %d", errDiverged, base)
					return stop
				}
			}
		}
		return nil
	})
	switch {
	case stop != nil:
		return stop
	case err != nil:
		return session.Errorf(session.CodeUnavailable, "%v", err)
	}
	if top > base {
		if _, ok := pending[base+1]; !ok {
			return fmt.Errorf("%w (event %d is missing)", errReplayGap, base+1)
		}
	}
	evs := make([]session.Stored, 0, min(len(pending), maxBatch))
	flush := func() error {
		if len(evs) == 0 {
			return nil
		}
		err := hist.Append(ctx, evs)
		evs = evs[:0]
		return err
	}
	for seq := base + 1; seq <= top; seq++ {
		raw, ok := pending[seq]
		if !ok {
			return fmt.Errorf("%w (event %d is missing)", errReplayGap, seq)
		}
		var head struct {
			Kind session.Kind `json:"kind"`
		}
		if err := json.Unmarshal(raw, &head); err != nil || head.Kind == "" {
			return fmt.Errorf("replay the events stream: event %d has no kind", seq)
		}
		evs = append(evs, session.Stored{Seq: seq, Kind: head.Kind, JSON: raw})
		if len(evs) == maxBatch {
			if err := flush(); err != nil {
				return fmt.Errorf("replay into the history: %w", err)
			}
		}
	}
	if err := flush(); err != nil {
		return fmt.Errorf("replay into the history: %w", err)
	}
	if meta != nil {
		var m session.Meta
		if err := json.Unmarshal(meta, &m); err != nil {
			return fmt.Errorf("replay the events stream: metadata: %w", err)
		}
		if err := hist.SetMeta(ctx, m); err != nil {
			return fmt.Errorf("replay metadata: %w", err)
		}
	}
	if top > base {
		o.log.Info("replayed events from the stream", "from", base+1, "to", top)
	}
	return nil
}
