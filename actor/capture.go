package actor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	ajs "github.com/atriumhq/atrium/actor/jetstream"
	"github.com/atriumhq/atrium/session"
)

// Capture (DESIGN §4): the owner publishes each committed event on the
// session's Events subject with JetStream, and reports it durable (acking
// its sender) only once the events stream has acknowledged it. Gateways keep
// receiving the same message on their core subscriptions: same subject,
// same bytes. Nats-Msg-Id is "<epoch>.<seq>", so a retried publish is stored
// once, and a node that lost its lease cannot store a different event under
// a seq the new owner already wrote (within the stream's two-minute
// duplicate window). Metadata (secrets included) is published on the
// session's Meta subject after every change, in the same stream, so a node
// taking the session over finds the metadata in force at the last event it
// replays: the two never disagree, which a separate bucket could not promise.

// captureTimeout bounds the wait for one PubAck before it is retried.
const captureTimeout = 5 * time.Second

// msgID is the Nats-Msg-Id of event seq of a session with epoch.
func msgID(epoch string, seq session.Seq) string {
	return epoch + "." + strconv.FormatInt(int64(seq), 10)
}

// eventMsg is the message that captures ev.
func (h *Host) eventMsg(id session.ID, epoch string, ev session.Stored) *nats.Msg {
	return &nats.Msg{
		Subject: h.cfg.Subjects.Capture(id),
		Data:    ev.JSON,
		Header:  nats.Header{jetstream.MsgIDHeader: []string{msgID(epoch, ev.Seq)}},
	}
}

// metaMsg is the message that captures m.
func (h *Host) metaMsg(m *session.Meta) *nats.Msg {
	return &nats.Msg{
		Subject: h.cfg.Subjects.Meta(m.ID),
		Data:    mustMarshal(m),
		Header:  nats.Header{jetstream.MsgIDHeader: []string{m.Epoch + ".meta." + randomHex()}},
	}
}

// randomHex returns 16 random hex digits.
func randomHex() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// errSeqTaken means the stream already held an event under the Msg-Id of
// one this node published for the first time: another owner wrote that seq
// (this node lost its lease, or its file diverged from the stream).
var errSeqTaken = ajs.ErrSeqTaken

// sameStored returns nil if the events stream holds data at sequence seq,
// errSeqTaken if it holds something else there.
func (h *Host) sameStored(ctx context.Context, seq uint64, data []byte) error {
	return h.events.SameStored(ctx, seq, data)
}

// captureEvents publishes evs (and m, if not nil) and waits for the stream.
// Nothing is published unless this node may write the session now
// (mayWrite): its record held and its node lease renewed recently.
func (h *Host) captureEvents(ctx context.Context, id session.ID, epoch string, evs []session.Stored, m *session.Meta) (uint64, error) {
	msgs := make([]*nats.Msg, 0, len(evs)+1)
	for _, ev := range evs {
		msgs = append(msgs, h.eventMsg(id, epoch, ev))
	}
	if m != nil {
		msgs = append(msgs, h.metaMsg(m))
	}
	top, err := h.events.Capture(ctx, msgs, func() error {
		if err := h.mayWrite(id); err != nil {
			return err
		}
		return h.storeFull()
	})
	if err != nil {
		h.leaseMu.Lock()
		l := h.leases[id]
		h.leaseMu.Unlock()
		if l != nil {
			l.uncaptured.Store(true)
		}
	}
	return top, err
}

// storeFull returns why the JetStream store cannot take writes now (see
// Config.StoreFull), nil if nothing says so.
func (h *Host) storeFull() error {
	if h.cfg.StoreFull == nil {
		return nil
	}
	return h.cfg.StoreFull()
}

// streamLast is the newest message of a subject in the events stream; nil
// when there is none. It reads from the stream's leader: a replica that lags
// could name an older message, and a takeover that believed it would trust a
// history that misses acknowledged events.
func (h *Host) streamLast(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	return h.events.Last(ctx, subject)
}

// seqOf reads the seq of an encoded event.
func seqOf(raw []byte) (session.Seq, error) {
	var head struct {
		Seq session.Seq `json:"seq"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return 0, fmt.Errorf("decode event: %w", err)
	}
	if head.Seq <= 0 {
		return 0, errors.New("decode event: no seq")
	}
	return head.Seq, nil
}

// isControl reports whether a message of the Events subject is a control
// message rather than an event.
func isControl(h nats.Header) bool { return h != nil && h.Get(session.HeaderControl) != "" }

// forget removes a deleted session's messages from the events stream and
// its checkpoints. The deleted control message published afterwards stays
// in the stream: a node asked to activate the session finds it and answers
// not found.
func (h *Host) forget(ctx context.Context, id session.ID) error {
	var errs []error
	for _, subj := range []string{h.cfg.Subjects.Events(id), h.cfg.Subjects.Meta(id)} {
		if err := h.events.Purge(ctx, subj); err != nil {
			errs = append(errs, fmt.Errorf("purge %s from the events stream: %w", subj, err))
		}
	}
	if err := h.deleteCheckpoints(ctx, id); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
