package jetstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/session/retry"
)

// Defaults of Events.
const (
	// DefaultCaptureRetryMin and DefaultCaptureRetryMax bound the backoff
	// between capture attempts.
	DefaultCaptureRetryMin = 20 * time.Millisecond
	DefaultCaptureRetryMax = time.Second
	// DefaultCaptureGiveUp is how long a capture keeps retrying messages
	// the stream does not store before it fails with the last error. A
	// capture that retried forever held the session's only committer: when
	// the JetStream store's disk filled, the server disabled JetStream and
	// every later prompt waited behind it (issue 21).
	DefaultCaptureGiveUp = 30 * time.Second
)

// guardEvery is how often Capture asks its guard again while it waits for
// acknowledgements.
const guardEvery = 100 * time.Millisecond

// ErrSeqTaken means the stream already held an event under the Msg-Id of
// one published for the first time: another owner wrote that seq.
var ErrSeqTaken = errors.New("the events stream already holds another event with this seq")

// ErrStoreFull means JetStream refused to store a message for lack of
// resources: its disk (or its configured store limit) is full, and a server
// that runs out of disk disables JetStream until an operator acts.
var ErrStoreFull = errors.New("the JetStream store is out of space (disk full or store limit reached)")

// Events is the stream that captures every session's events and metadata.
type Events struct {
	nc     *nats.Conn
	js     njs.JetStream
	stream njs.Stream
	name   string
	log    *slog.Logger

	// RetryMin, RetryMax and GiveUp tune Capture (Default* when zero).
	RetryMin, RetryMax, GiveUp time.Duration
}

// NewEvents returns the events stream name, opened as stream.
func NewEvents(nc *nats.Conn, js njs.JetStream, stream njs.Stream, name string, log *slog.Logger) *Events {
	if log == nil {
		log = slog.Default()
	}
	return &Events{nc: nc, js: js, stream: stream, name: name, log: log}
}

// Capture publishes msgs to the stream and waits until every one is stored,
// retrying the ones that failed with backoff for up to GiveUp after the
// first failure, or until ctx ends. guard runs before every attempt: an
// error from it (the lease may be lost) ends the capture before anything
// more is published. It returns the highest stream sequence stored. A retry
// may store a message after one that followed it; replay orders events by
// seq. A message the stream reports as a duplicate on its first attempt
// fails the capture with ErrSeqTaken (on a retry, the duplicate counts only
// if the stream holds the same bytes: it is the earlier attempt's).
// Messages on subjects ending in ".meta" carry random Msg-Ids and are never
// checked so. An ack that says the server's store is full (see StoreFull)
// fails the capture at once, wrapping ErrStoreFull, without retrying.
func (e *Events) Capture(ctx context.Context, msgs []*nats.Msg, guard func() error) (uint64, error) {
	retryMin, retryMax, giveUp := e.RetryMin, e.RetryMax, e.GiveUp
	if retryMin <= 0 {
		retryMin = DefaultCaptureRetryMin
	}
	if retryMax <= 0 {
		retryMax = DefaultCaptureRetryMax
	}
	if giveUp <= 0 {
		giveUp = DefaultCaptureGiveUp
	}
	var top uint64
	var firstFailure time.Time
	tick := time.NewTicker(guardEvery)
	defer tick.Stop()
	pending := msgs
	futures := make([]njs.PubAckFuture, 0, len(msgs))
	backoff := retry.Policy{Min: retryMin, Max: retryMax}.BackOff()
	for first := true; ; first = false {
		futures = futures[:0]
		if err := guard(); err != nil {
			return top, fmt.Errorf("capture events: %w", err)
		}
		var failed []*nats.Msg
		var lastErr error
		for i, m := range pending {
			f, err := e.js.PublishMsgAsync(m)
			if err != nil {
				failed, lastErr = append(failed, pending[i:]...), err
				break
			}
			futures = append(futures, f)
		}
		for _, f := range futures {
		wait:
			select {
			case <-tick.C:
				// The guard is asked again while acks are awaited: once it
				// fails (the store is known full, the lease may be lost)
				// nothing more is gained by waiting out captureTimeout.
				if err := guard(); err != nil {
					return top, fmt.Errorf("capture events: %w", err)
				}
				goto wait
			case ack := <-f.Ok():
				if ack.Duplicate && f.Msg().Subject != "" && !strings.HasSuffix(f.Msg().Subject, ".meta") {
					// On a retry the duplicate may be the earlier attempt's,
					// or another owner's event of that seq (a first attempt
					// that failed during a leader change): only the same
					// bytes in the stream count as captured.
					if !first {
						if err := e.SameStored(ctx, ack.Sequence, f.Msg().Data); err == nil {
							top = max(top, ack.Sequence)
							continue
						} else if !errors.Is(err, ErrSeqTaken) {
							failed, lastErr = append(failed, f.Msg()), err // Not known yet: retried.
							continue
						}
					}
					return top, fmt.Errorf("capture event %s: %w", f.Msg().Header.Get(njs.MsgIDHeader), ErrSeqTaken)
				}
				top = max(top, ack.Sequence)
			case err := <-f.Err():
				failed, lastErr = append(failed, f.Msg()), err
			case <-ctx.Done():
				return top, fmt.Errorf("capture events: %w (last error: %v)", context.Cause(ctx), lastErr)
			}
		}
		if len(failed) == 0 {
			return top, nil
		}
		lastErr = classify(lastErr)
		if ctx.Err() != nil || errors.Is(lastErr, ErrStoreFull) {
			// A server that answered "insufficient resources" stays full
			// until space is freed: retrying for GiveUp only held the
			// session's committer and its callers (issue 21).
			return top, fmt.Errorf("capture events: %w", lastErr)
		}
		if firstFailure.IsZero() {
			firstFailure = time.Now()
		} else if time.Since(firstFailure) >= giveUp {
			return top, fmt.Errorf("capture events: %d not stored after retrying for %v: %w",
				len(failed), time.Since(firstFailure).Round(time.Millisecond), lastErr)
		}
		e.log.Debug("capture events: retrying", "messages", len(failed), "err", lastErr)
		t := time.NewTimer(backoff.NextBackOff())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return top, fmt.Errorf("capture events: %w (last error: %v)", context.Cause(ctx), lastErr)
		}
		pending = failed
	}
}

// The error codes of nats-server's acks that refuse a message for lack of
// room: JSInsufficientResourcesErr (the server's max_file_store or
// max_memory_store is reached), JSStorageResourcesExceededErr and
// JSMemoryResourcesExceededErr (a reservation does not fit), and
// JSAccountResourcesExceededErr (the account's JetStream limits).
const (
	jsErrInsufficientResources    njs.ErrorCode = 10023
	jsErrStorageResourcesExceeded njs.ErrorCode = 10047
	jsErrMemoryResourcesExceeded  njs.ErrorCode = 10028
	jsErrAccountResourcesExceeded njs.ErrorCode = 10002
)

// StoreFull returns err wrapped with ErrStoreFull if it says the NATS
// server's JetStream store is full (an ack or API error of the codes above,
// or a message saying so), else err.
func StoreFull(err error) error { return classify(err) }

// classify wraps an error that says JetStream is out of space with
// ErrStoreFull.
func classify(err error) error {
	if err == nil || errors.Is(err, ErrStoreFull) {
		return err
	}
	var apiErr *njs.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jsErrInsufficientResources, jsErrStorageResourcesExceeded, jsErrMemoryResourcesExceeded, jsErrAccountResourcesExceeded:
			return fmt.Errorf("%w: the NATS server's JetStream store is full (it answered %q, err_code %d)", ErrStoreFull, apiErr.Description, apiErr.ErrorCode)
		}
	}
	msg := strings.ToLower(err.Error())
	for _, s := range []string{"insufficient resources", "insufficient storage resources", "insufficient memory resources", "resource limits exceeded", "no space left", "out of space", "out of resources", "storage resources exceeded"} {
		if strings.Contains(msg, s) {
			return fmt.Errorf("%w: %w", ErrStoreFull, err)
		}
	}
	return err
}

// SameStored returns nil if the stream holds data at sequence seq,
// ErrSeqTaken if it holds something else there.
func (e *Events) SameStored(ctx context.Context, seq uint64, data []byte) error {
	m, err := e.stream.GetMsg(ctx, seq)
	if err != nil {
		return fmt.Errorf("read the duplicate at stream sequence %d: %w", seq, err)
	}
	if !bytes.Equal(m.Data, data) {
		return ErrSeqTaken
	}
	return nil
}

// Last returns the newest message of subject in the stream, nil if there is
// none, read from the stream's leader (see LeaderLast).
func (e *Events) Last(ctx context.Context, subject string) (*njs.RawStreamMsg, error) {
	m, err := LeaderLast(ctx, e.nc, e.name, subject)
	if err != nil {
		return nil, fmt.Errorf("read the events stream: %w", err)
	}
	return m, nil
}

// Purge removes every message of subject from the stream.
func (e *Events) Purge(ctx context.Context, subject string) error {
	return e.stream.Purge(ctx, njs.WithPurgeSubject(subject))
}

// Replay batching: how many messages one fetch asks for; after
// replayEmptyFetches fetches in a row found nothing, replayEmptyWait apart,
// the stream is taken to lack the rest.
const (
	replayBatch        = 256
	replayEmptyFetches = 50
	replayEmptyWait    = 20 * time.Millisecond
)

// ErrReplayStalled means a replay found nothing more before reaching the
// sequence it had to reach.
var ErrReplayStalled = errors.New("the events stream stopped before the sequence a replay needed")

// Msg is one message a replay delivers.
type Msg struct {
	Subject   string
	Header    nats.Header
	Data      []byte
	StreamSeq uint64
}

// Replay delivers to fn, in stream order, the messages of subjects from
// stream sequence start (1: all) until one at or after target was delivered.
// An error from fn ends the replay with it.
func (e *Events) Replay(ctx context.Context, subjects []string, start, target uint64, fn func(Msg) error) error {
	if target < start {
		return nil
	}
	cfg := njs.OrderedConsumerConfig{FilterSubjects: subjects, DeliverPolicy: njs.DeliverAllPolicy}
	if start > 1 {
		cfg.DeliverPolicy, cfg.OptStartSeq = njs.DeliverByStartSequencePolicy, start
	}
	cons, err := e.stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("replay the events stream: %w", err)
	}
	empty := 0
	for done := false; !done; {
		batch, err := cons.FetchNoWait(replayBatch)
		if err != nil {
			return fmt.Errorf("replay the events stream: %w", err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			md, err := msg.Metadata()
			if err != nil {
				return fmt.Errorf("replay the events stream: %w", err)
			}
			if md.Sequence.Stream >= target {
				done = true
			}
			if err := fn(Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data(), StreamSeq: md.Sequence.Stream}); err != nil {
				return err
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, njs.ErrNoMessages) {
			return fmt.Errorf("replay the events stream: %w", err)
		}
		if n == 0 && !done {
			// The consumer may not have the messages at hand yet.
			if empty++; empty == replayEmptyFetches {
				return fmt.Errorf("replay the events stream: %w (sequence %d)", ErrReplayStalled, target)
			}
			t := time.NewTimer(replayEmptyWait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return fmt.Errorf("replay the events stream: %w", ctx.Err())
			}
		}
	}
	return nil
}
