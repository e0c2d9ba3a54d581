package dlq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/atriumhq/atrium/gateway/dlq"
	"github.com/atriumhq/atrium/session"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// startNATS runs an in-process nats-server with JetStream and returns a
// JetStream context on a connection to it.
func startNATS(t testing.TB) jetstream.JetStream {
	t.Helper()
	ns, err := server.NewServer(&server.Options{
		DontListen: true, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
	})
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	nc, err := nats.Connect("", nats.InProcessServer(ns))
	if err != nil {
		t.Fatalf("connect nats: %v", err)
	}
	t.Cleanup(func() {
		nc.Close()
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return js
}

func openQueue(t testing.TB, js jetstream.JetStream) *dlq.Queue {
	t.Helper()
	q, err := dlq.Open(context.Background(), dlq.Config{JetStream: js, Bucket: "test_dlq"})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return q
}

func put(t testing.TB, q *dlq.Queue, e dlq.Entry) dlq.Entry {
	t.Helper()
	got, err := q.Put(context.Background(), e)
	if err != nil {
		t.Fatalf("put: %v", err)
	}
	return got
}

func TestQueue_PutGetListDelete(t *testing.T) {
	ctx := context.Background()
	q := openQueue(t, startNATS(t))
	t0 := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)
	old := put(t, q, dlq.Entry{Tenant: "acme", User: "ann", Kind: "task", Ref: "t1", Reason: "forge down",
		Attempts: 5, Payload: json.RawMessage(`{"repo":"x"}`), FailedAt: t0})
	newer := put(t, q, dlq.Entry{Tenant: "acme", User: "bob", Kind: "schedule", Ref: "sc1", Reason: "no access",
		Permanent: true, Attempts: 1, FailedAt: t0.Add(time.Minute)})
	other := put(t, q, dlq.Entry{Tenant: "globex", User: "gil", Kind: "task", Ref: "t2", Reason: "x", FailedAt: t0})
	if !strings.HasPrefix(old.ID, "dl_") || old.ID == newer.ID {
		t.Fatalf("ids %q, %q: want distinct dl_ ids", old.ID, newer.ID)
	}

	got, err := q.Get(ctx, old.ID)
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if got.User != "ann" || got.Reason != "forge down" || got.Attempts != 5 || string(got.Payload) != `{"repo":"x"}` || !got.FailedAt.Equal(t0) {
		t.Errorf("get = %+v, want what was put", got)
	}

	list, err := q.List(ctx, "acme")
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	if len(list) != 2 || list[0].ID != newer.ID || list[1].ID != old.ID {
		t.Fatalf("list(acme) = %v, want [%s %s] (newest first)", ids(list), newer.ID, old.ID)
	}
	list, _ = q.List(ctx, "globex")
	if len(list) != 1 || list[0].ID != other.ID {
		t.Fatalf("list(globex) = %v, want [%s]", ids(list), other.ID)
	}

	if err := q.Delete(ctx, old.ID); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := q.Get(ctx, old.ID); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("get after delete: %v, want not found", err)
	}
	if err := q.Delete(ctx, old.ID); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("delete twice: %v, want not found", err)
	}
	if _, err := q.Get(ctx, "../x"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("get of a bad id: %v, want not found", err)
	}
	list, _ = q.List(ctx, "acme")
	if len(list) != 1 || list[0].ID != newer.ID {
		t.Fatalf("list after delete = %v, want [%s]", ids(list), newer.ID)
	}
}

func TestQueue_PutFillsIn(t *testing.T) {
	q := openQueue(t, startNATS(t))
	before := time.Now()
	e := put(t, q, dlq.Entry{Tenant: "acme", Kind: "task", Reason: strings.Repeat("é", dlq.MaxReasonBytes)})
	if e.FailedAt.Before(before.Add(-time.Second)) || e.FailedAt.Location() != time.UTC {
		t.Errorf("failed_at = %v, want now in UTC", e.FailedAt)
	}
	if len(e.Reason) > dlq.MaxReasonBytes || !strings.HasSuffix(e.Reason, "…") || !strings.HasPrefix(e.Reason, "éé") {
		t.Errorf("reason of %d bytes not cut to %d with an ellipsis", len(e.Reason), dlq.MaxReasonBytes)
	}
	if _, err := q.Put(context.Background(), dlq.Entry{Tenant: "acme"}); err == nil {
		t.Error("put without a kind: no error")
	}
}

func TestQueue_Retry(t *testing.T) {
	ctx := context.Background()
	q := openQueue(t, startNATS(t))
	var seen []dlq.Entry
	fail := errors.New("forge still down")
	q.Handle("task", func(ctx context.Context, e dlq.Entry) error {
		seen = append(seen, e)
		if len(seen) == 1 {
			return dlq.Transient(fail)
		}
		if len(seen) == 2 {
			return errors.New("repository gone")
		}
		return nil
	})
	e := put(t, q, dlq.Entry{Tenant: "acme", User: "ann", Kind: "task", Ref: "t1", Reason: "forge down", Attempts: 5,
		Payload: json.RawMessage(`{"n":1}`)})

	t.Run("transient failure keeps the entry", func(t *testing.T) {
		if err := q.Retry(ctx, e.ID); !errors.Is(err, fail) {
			t.Fatalf("retry = %v, want the handler's error", err)
		}
		got, err := q.Get(ctx, e.ID)
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		if got.Reason != "forge still down" || got.Attempts != 6 || got.Permanent {
			t.Errorf("entry after failed retry = %+v, want the new reason, 6 attempts, not permanent", got)
		}
		if string(seen[0].Payload) != `{"n":1}` || seen[0].Ref != "t1" {
			t.Errorf("handler got %+v, want the entry", seen[0])
		}
	})
	t.Run("permanent failure marks it", func(t *testing.T) {
		if err := q.Retry(ctx, e.ID); err == nil {
			t.Fatal("retry: no error")
		}
		got, _ := q.Get(ctx, e.ID)
		if got.Reason != "repository gone" || got.Attempts != 7 || !got.Permanent {
			t.Errorf("entry = %+v, want permanent with 7 attempts", got)
		}
	})
	t.Run("success deletes it", func(t *testing.T) {
		if err := q.Retry(ctx, e.ID); err != nil {
			t.Fatalf("retry: %v", err)
		}
		if _, err := q.Get(ctx, e.ID); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("get after successful retry: %v, want not found", err)
		}
	})
	t.Run("kind without a handler", func(t *testing.T) {
		o := put(t, q, dlq.Entry{Tenant: "acme", Kind: "mystery"})
		err := q.Retry(ctx, o.ID)
		if !errors.Is(err, session.ErrUnavailable) || !strings.Contains(err.Error(), "atrium dlq drop") {
			t.Errorf("retry = %v, want unavailable saying how to drop it", err)
		}
		if q.CanRetry("mystery") || !q.CanRetry("task") {
			t.Error("CanRetry is wrong")
		}
	})
	t.Run("unknown id", func(t *testing.T) {
		if err := q.Retry(ctx, "dl_nope"); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("retry = %v, want not found", err)
		}
	})
}

func TestQueue_RetryDroppedMeanwhile(t *testing.T) {
	ctx := context.Background()
	q := openQueue(t, startNATS(t))
	e := put(t, q, dlq.Entry{Tenant: "acme", Kind: "task"})
	q.Handle("task", func(ctx context.Context, _ dlq.Entry) error {
		if err := q.Delete(ctx, e.ID); err != nil {
			t.Errorf("drop during retry: %v", err)
		}
		return errors.New("failed again")
	})
	if err := q.Retry(ctx, e.ID); err == nil || err.Error() != "failed again" {
		t.Fatalf("retry = %v, want the handler's error only", err)
	}
	if _, err := q.Get(ctx, e.ID); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("an entry dropped during its retry came back: %v", err)
	}
}

func TestIsTransient(t *testing.T) {
	base := errors.New("boom")
	for name, tc := range map[string]struct {
		err  error
		want bool
	}{
		"nil":               {nil, false},
		"plain":             {base, false},
		"marked":            {dlq.Transient(base), true},
		"marked, wrapped":   {fmt.Errorf("start sandbox: %w", dlq.Transient(base)), true},
		"deadline":          {fmt.Errorf("prompt: %w", context.DeadlineExceeded), true},
		"canceled":          {context.Canceled, false},
		"unavailable":       {session.Errorf(session.CodeUnavailable, "no node"), true},
		"forbidden":         {session.Errorf(session.CodeForbidden, "no"), false},
		"nats no responder": {fmt.Errorf("place: %w", nats.ErrNoResponders), true},
		"nats timeout":      {nats.ErrTimeout, true},
		"quota":             {fmt.Errorf("prompt: %w", session.Errorf(session.CodeTooManyRequests, "over quota")), true},
	} {
		t.Run(name, func(t *testing.T) {
			if got := dlq.IsTransient(tc.err); got != tc.want {
				t.Errorf("IsTransient(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
	if !errors.Is(dlq.Transient(base), base) {
		t.Error("Transient does not wrap its error")
	}
	if dlq.Transient(nil) != nil {
		t.Error("Transient(nil) != nil")
	}
}

func TestBackoff_Do(t *testing.T) {
	transient := dlq.Transient(errors.New("unavailable"))
	t.Run("retries transient errors up to Attempts with capped delays", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := dlq.Backoff{Base: time.Second, Max: 4 * time.Second, Attempts: 5}
			var at []time.Time
			start := time.Now()
			n, err := b.Do(t.Context(), func(context.Context) error {
				at = append(at, time.Now())
				return transient
			})
			if n != 5 || !errors.Is(err, transient) || len(at) != 5 {
				t.Fatalf("Do = %d, %v after %d calls; want 5 attempts and the last error", n, err, len(at))
			}
			// Caps after each failure: 1s, 2s, 4s, 4s.
			caps := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second}
			prev := start
			for i, c := range at {
				if i > 0 {
					if d := c.Sub(prev); d < 0 || d > caps[i-1] {
						t.Errorf("delay before attempt %d = %v, want within [0, %v]", i+1, d, caps[i-1])
					}
				}
				prev = c
			}
		})
	})
	t.Run("stops at the first success", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			calls := 0
			n, err := dlq.Backoff{}.Do(t.Context(), func(context.Context) error {
				calls++
				if calls < 3 {
					return transient
				}
				return nil
			})
			if n != 3 || err != nil {
				t.Fatalf("Do = %d, %v; want 3, nil", n, err)
			}
		})
	})
	t.Run("does not retry permanent errors", func(t *testing.T) {
		perm := errors.New("bad repository")
		n, err := dlq.Backoff{}.Do(t.Context(), func(context.Context) error { return perm })
		if n != 1 || !errors.Is(err, perm) {
			t.Fatalf("Do = %d, %v; want 1 and the error", n, err)
		}
	})
	t.Run("gives up when the context ends", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			calls := 0
			n, err := dlq.Backoff{Base: time.Hour, Max: time.Hour, Attempts: 10}.Do(ctx, func(context.Context) error {
				calls++
				if calls == 2 {
					cancel()
				}
				return transient
			})
			// The first delay may be zero (full jitter), so the cancel
			// happens during the second call at the latest.
			if n != 2 || !errors.Is(err, context.Canceled) || !errors.Is(err, transient) {
				t.Fatalf("Do = %d, %v; want 2 attempts and an error wrapping both", n, err)
			}
		})
	})
}

func ids(es []dlq.Entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.ID
	}
	return out
}
