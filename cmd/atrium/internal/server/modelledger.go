package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/compute/modelgw"
	"github.com/atriumhq/atrium/session"
)

// modelSpendBucket is the KV bucket of the model budgets' windows, shared
// by every node: one key per window (modelgw.Budget.WindowKey).
const modelSpendBucket = session.DefaultPrefix + "_model_spend"

// modelSpendTTL keeps a window's record a little longer than the longest
// period (a month) after its last update.
const modelSpendTTL = 32 * 24 * time.Hour

// kvLedger is the model gateway's budget ledger in NATS KV, so that tenant
// budgets hold across the nodes and windows survive restarts.
type kvLedger struct {
	js       jetstream.JetStream
	replicas int

	mu sync.Mutex
	kv jetstream.KeyValue // guarded by mu; nil until opened
}

var _ modelgw.Ledger = (*kvLedger)(nil)

// spendRecord is a window's value.
type spendRecord struct {
	Tokens int64   `json:"tokens"`
	Cost   float64 `json:"cost_usd"`
}

func newKVLedger(nc *nats.Conn, replicas int) (*kvLedger, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("model budgets: %w", err)
	}
	return &kvLedger{js: js, replicas: max(replicas, 1)}, nil
}

func (l *kvLedger) open(ctx context.Context) (jetstream.KeyValue, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.kv != nil {
		return l.kv, nil
	}
	kv, err := l.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: modelSpendBucket,
		Description: "Atrium model budgets: tokens and cost spent per window", TTL: modelSpendTTL, Replicas: l.replicas})
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", modelSpendBucket, err)
	}
	l.kv = kv
	return kv, nil
}

func (l *kvLedger) get(ctx context.Context, kv jetstream.KeyValue, key string) (spendRecord, uint64, error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return spendRecord{}, 0, nil
	}
	if err != nil {
		return spendRecord{}, 0, err
	}
	var r spendRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return spendRecord{}, 0, fmt.Errorf("model spend %s: %w", key, err)
	}
	return r, e.Revision(), nil
}

// Spent implements modelgw.Ledger.
func (l *kvLedger) Spent(ctx context.Context, key string) (int64, float64, error) {
	kv, err := l.open(ctx)
	if err != nil {
		return 0, 0, err
	}
	r, _, err := l.get(ctx, kv, key)
	return r.Tokens, r.Cost, err
}

// Add implements modelgw.Ledger: a compare-and-set on the window's record,
// repeated after a short random pause when another writer got in between,
// until ctx ends.
func (l *kvLedger) Add(ctx context.Context, key string, tokens int64, cost float64, _ time.Time) error {
	kv, err := l.open(ctx)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		r, rev, err := l.get(ctx, kv, key)
		if err != nil {
			return err
		}
		r.Tokens += tokens
		r.Cost += cost
		b, _ := json.Marshal(r)
		if rev == 0 {
			_, err = kv.Create(ctx, key, b)
		} else {
			_, err = kv.Update(ctx, key, b, rev)
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSequence(err) {
			return fmt.Errorf("model spend %s: %w", key, err)
		}
		pause := time.NewTimer(time.Duration(rand.Int64N(int64(min(attempt+1, 20)) * int64(time.Millisecond))))
		select {
		case <-pause.C:
		case <-ctx.Done():
			pause.Stop()
			return fmt.Errorf("model spend %s: concurrent updates: %w", key, ctx.Err())
		}
	}
}

// isWrongSequence reports a failed compare-and-set.
func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
