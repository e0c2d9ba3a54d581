// Package jetstream implements the session actor's cluster protocol over
// NATS JetStream (DESIGN §4, §5): the owners bucket, a compare-and-set
// register of node leases, session ownership records and rescue claims whose
// revisions are the fencing tokens (Owners), and the capture of session
// events and metadata into the events stream (Events). The actor declares
// the interfaces it consumes (actor/cluster.go); this package knows nothing
// of sessions' state machines, only of the store.
package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
)

// Sentinel errors of the owners register, matched with errors.Is.
var (
	// ErrExists means a create found the key already written.
	ErrExists = errors.New("jetstream: key exists")
	// ErrRevision means a compare-and-set found the key at another revision.
	ErrRevision = errors.New("jetstream: key is at another revision")
)

// Record is the newest message of a key of the owners bucket.
type Record struct {
	Key string
	// Rev is the message's stream sequence: the key's revision, and for a
	// session's ownership record the fencing token of its holder.
	Rev   uint64
	Value []byte
	// Deleted marks a delete, a purge or an expiry marker.
	Deleted bool
}

// Owners is the owners bucket (a JetStream key-value bucket) seen as a
// compare-and-set register. Every read that a decision rests on goes to the
// stream's leader (Latest): a replica that lags could show a lease that is
// already gone, or hide one that is held.
type Owners struct {
	nc     *nats.Conn
	js     njs.JetStream
	kv     njs.KeyValue
	bucket string
}

// NewOwners returns the register over bucket, opened as kv.
func NewOwners(nc *nats.Conn, js njs.JetStream, kv njs.KeyValue, bucket string) *Owners {
	return &Owners{nc: nc, js: js, kv: kv, bucket: bucket}
}

func (o *Owners) subject(key string) string { return "$KV." + o.bucket + "." + key }

// Latest returns the newest message of key, nil if there is none, as the
// stream's leader has it.
func (o *Owners) Latest(ctx context.Context, key string) (*Record, error) {
	m, err := LeaderLast(ctx, o.nc, "KV_"+o.bucket, o.subject(key))
	if err != nil || m == nil {
		return nil, err
	}
	return &Record{Key: key, Rev: m.Sequence, Value: m.Data, Deleted: IsKVDelete(m.Header)}, nil
}

// Create writes val at key if the key holds nothing (or only a delete
// marker); ErrExists otherwise. A ttl above zero is the message's own TTL.
func (o *Owners) Create(ctx context.Context, key string, val []byte, ttl time.Duration) (uint64, error) {
	var opts []njs.KVCreateOpt
	if ttl > 0 {
		opts = append(opts, njs.KeyTTL(ttl))
	}
	rev, err := o.kv.Create(ctx, key, val, opts...)
	return rev, mapErr(err)
}

// Swap writes val at key if rev is still its newest revision (0: the key
// was never written); ErrRevision otherwise. A ttl above zero is the
// message's own TTL (a KV update the jetstream package has no TTL option
// for).
func (o *Owners) Swap(ctx context.Context, key string, val []byte, rev uint64, ttl time.Duration) (uint64, error) {
	if ttl <= 0 {
		next, err := o.kv.Update(ctx, key, val, rev)
		return next, mapErr(err)
	}
	m := nats.NewMsg(o.subject(key))
	m.Data = val
	ack, err := o.js.PublishMsg(ctx, m, njs.WithExpectLastSequencePerSubject(rev), njs.WithMsgTTL(ttl))
	if err != nil {
		return 0, mapErr(err)
	}
	return ack.Sequence, nil
}

// Delete writes a delete marker at key (ADR-8: a KV-Operation DEL message)
// if rev is still its newest revision, and returns the marker's revision;
// ErrRevision otherwise. Key watchers see the marker as a delete.
func (o *Owners) Delete(ctx context.Context, key string, rev uint64) (uint64, error) {
	m := nats.NewMsg(o.subject(key))
	m.Header.Set("KV-Operation", "DEL")
	ack, err := o.js.PublishMsg(ctx, m, njs.WithExpectLastSequencePerSubject(rev))
	if err != nil {
		return 0, mapErr(err)
	}
	return ack.Sequence, nil
}

// List returns the newest record of every key matching pattern (a NATS
// wildcard pattern of keys) that is not deleted. It reads the bucket through
// a consumer, not from the stream's leader: a record written a moment ago may
// be missing, so no decision that needs the newest revision rests on it.
func (o *Owners) List(ctx context.Context, pattern string) ([]*Record, error) {
	w, err := o.kv.Watch(ctx, pattern, njs.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", pattern, err)
	}
	defer w.Stop()
	var out []*Record
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("list %s: the watcher stopped", pattern)
			}
			if e == nil {
				return out, nil // The initial values are done.
			}
			out = append(out, &Record{Key: e.Key(), Rev: e.Revision(), Value: e.Value()})
		case <-ctx.Done():
			return nil, fmt.Errorf("list %s: %w", pattern, ctx.Err())
		}
	}
}

// Watch delivers every later write to the keys matching pattern (a NATS
// wildcard pattern of keys) on the returned channel until ctx ends or stop
// is called; the channel is closed when the watch ends.
func (o *Owners) Watch(ctx context.Context, pattern string) (updates <-chan *Record, stop func(), err error) {
	w, err := o.kv.Watch(ctx, pattern, njs.UpdatesOnly())
	if err != nil {
		return nil, nil, err
	}
	out := make(chan *Record)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(out)
		for {
			select {
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					continue
				}
				r := &Record{Key: e.Key(), Rev: e.Revision(), Value: e.Value(),
					Deleted: e.Operation() == njs.KeyValueDelete || e.Operation() == njs.KeyValuePurge}
				select {
				case out <- r:
				case <-done:
					return
				case <-ctx.Done():
					return
				}
			case <-done:
				return
			case <-ctx.Done():
				return
			}
		}
	})
	var once sync.Once
	return out, func() {
		once.Do(func() {
			close(done)
			w.Stop()
			wg.Wait()
		})
	}, nil
}

// mapErr turns JetStream's failed compare-and-set and create errors into
// ErrRevision and ErrExists, keeping the original in the chain.
func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, njs.ErrKeyExists):
		return fmt.Errorf("%w: %w", ErrExists, err)
	case IsWrongLastSeq(err):
		return fmt.Errorf("%w: %w", ErrRevision, err)
	}
	return err
}

// IsWrongLastSeq reports whether err is a failed compare-and-set.
func IsWrongLastSeq(err error) bool {
	var apiErr *njs.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == njs.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == 10164
	}
	return errors.Is(err, njs.ErrKeyExists) || errors.Is(err, njs.ErrKeyRevisionMismatch) ||
		errors.Is(err, ErrExists) || errors.Is(err, ErrRevision)
}

// IsKVDelete reports whether a KV message's headers mark a delete, a purge
// or an expiry marker.
func IsKVDelete(hdr nats.Header) bool {
	if hdr == nil {
		return false
	}
	op := hdr.Get("KV-Operation")
	return op == "DEL" || op == "PURGE" || hdr.Get("Nats-Marker-Reason") != ""
}

// LeaderLast returns the newest message of subject in stream, nil if there
// is none, as the stream's leader has it. A direct get (what the jetstream
// package uses for streams that allow it) may be answered by any replica,
// including one that lags behind messages already acknowledged: ownership
// and takeover decisions must not rest on such a read.
func LeaderLast(ctx context.Context, nc *nats.Conn, stream, subject string) (*njs.RawStreamMsg, error) {
	req, _ := json.Marshal(struct {
		LastBySubject string `json:"last_by_subj"`
	}{subject})
	resp, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", subject, err)
	}
	var r struct {
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Message *struct {
			Sequence uint64    `json:"seq"`
			Header   []byte    `json:"hdrs"`
			Data     []byte    `json:"data"`
			Time     time.Time `json:"time"`
		} `json:"message"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, fmt.Errorf("read %s: %w", subject, err)
	}
	if r.Error != nil {
		if r.Error.ErrCode == int(njs.JSErrCodeMessageNotFound) {
			return nil, nil
		}
		return nil, fmt.Errorf("read %s: %s (%d)", subject, r.Error.Description, r.Error.ErrCode)
	}
	if r.Message == nil {
		return nil, fmt.Errorf("read %s: empty reply", subject)
	}
	m := &njs.RawStreamMsg{Subject: subject, Sequence: r.Message.Sequence, Data: r.Message.Data, Time: r.Message.Time}
	if len(r.Message.Header) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(r.Message.Header); err != nil {
			return nil, fmt.Errorf("read %s: %w", subject, err)
		}
	}
	return m, nil
}
