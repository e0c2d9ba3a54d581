package actor

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestHost_DuplicateOnRetryIsChecked: a capture retried after its first
// attempt failed (a leader change under load) may be told "duplicate"
// because another owner stored that seq meanwhile; the bytes at the
// duplicate's sequence decide whether it was this capture's. sameStored is
// that check.
func TestHost_DuplicateOnRetryIsChecked(t *testing.T) {
	e := newEnv(t)
	id := e.create("alice", shell())
	subj := e.subj.Capture(id)
	msg := &nats.Msg{Subject: subj, Data: []byte(`{"seq":99,"kind":"message","by":"bob"}`),
		Header: nats.Header{jetstream.MsgIDHeader: []string{"test.99"}}}
	ack, err := e.host.js.PublishMsg(t.Context(), msg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.host.sameStored(t.Context(), ack.Sequence, msg.Data); err != nil {
		t.Errorf("the same bytes: %v, want nil", err)
	}
	err = e.host.sameStored(t.Context(), ack.Sequence, []byte(`{"seq":99,"kind":"message","by":"alice"}`))
	if !errors.Is(err, errSeqTaken) {
		t.Errorf("other bytes: %v, want errSeqTaken", err)
	}
}
