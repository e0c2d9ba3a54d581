package hooks

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/atriumhq/atrium/gateway/channel"
	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats.go/jetstream"
)

// Statuses of a Delivery.
const (
	StatusRetrying  = "retrying"
	StatusDelivered = "delivered"
	StatusFailed    = "failed"
)

// Delivery is one event's delivery to one target, as the delivery log
// shows it. It never holds the target's URL or secret.
type Delivery struct {
	ID      string       `json:"id"`
	Session session.ID   `json:"session"`
	Target  string       `json:"target"`
	Seq     session.Seq  `json:"seq"`
	Kind    session.Kind `json:"kind"`
	// Status is retrying, delivered or failed (given up).
	Status   string `json:"status"`
	Attempts int    `json:"attempts"`
	// LastCode is the HTTP status of the last attempt, 0 if it got none.
	LastCode  int       `json:"last_code,omitempty"`
	LastError string    `json:"last_error,omitempty"`
	FirstAt   time.Time `json:"first_attempt_at"`
	LastAt    time.Time `json:"last_attempt_at"`
}

// Payload is the body of an outbound delivery.
type Payload struct {
	Delivery string          `json:"delivery"`
	Session  session.ID      `json:"session"`
	Event    json.RawMessage `json:"event"`
}

// Deliver implements channel.Webhooks: it POSTs one event to target,
// signed with the target's secret, and records the attempt in the delivery
// log. 2xx is delivered; 429 is retried after its Retry-After; 408, 5xx and
// network failures are retried until Config.Attempts; any other answer
// fails the delivery for good.
func (h *Hooks) Deliver(ctx context.Context, target string, id session.ID, event json.RawMessage, attempt int) error {
	t, ok := h.targets[target]
	if !ok {
		return channel.Permanent(fmt.Errorf("webhook target %q is not configured", target))
	}
	var ev struct {
		Seq  session.Seq  `json:"seq"`
		Kind session.Kind `json:"kind"`
	}
	if err := json.Unmarshal(event, &ev); err != nil {
		return channel.Permanent(fmt.Errorf("webhook %s: decode event: %w", target, err))
	}
	d := Delivery{ID: string(id) + "." + strconv.FormatInt(ev.Seq, 10) + "." + target, Session: id, Target: target,
		Seq: ev.Seq, Kind: ev.Kind, Attempts: attempt, LastAt: h.cfg.Now().UTC()}
	d.FirstAt = d.LastAt
	if attempt > 1 {
		if old := h.record(ctx, d.ID); old != nil {
			d.FirstAt = old.FirstAt
		}
	}
	body, _ := json.Marshal(Payload{Delivery: d.ID, Session: id, Event: event})
	code, retryAfter, err := h.post(ctx, t, d, body, attempt)
	d.LastCode = code
	switch {
	case err == nil:
		d.Status = StatusDelivered
	case ctx.Err() != nil:
		return err // shutting down: the next driver delivers it again
	case attempt >= h.cfg.Attempts || !retryable(code):
		d.Status, d.LastError = StatusFailed, err.Error()
		err = channel.Permanent(err)
	default:
		d.Status, d.LastError = StatusRetrying, err.Error()
		if retryAfter > 0 {
			err = &channel.RateLimited{After: retryAfter, Err: err}
		}
	}
	h.save(ctx, d)
	return err
}

// post makes one attempt and returns the HTTP status (0 if none) and the
// Retry-After of a 429.
func (h *Hooks) post(ctx context.Context, t Target, d Delivery, body []byte, attempt int) (int, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.URL, bytes.NewReader(body))
	if err != nil {
		return 0, 0, fmt.Errorf("webhook %s: the target's url is not valid", t.Name)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "Atrium-Webhooks/1")
	req.Header.Set(SignatureHeader, Sign([]byte(t.Secret), h.cfg.Now(), body))
	req.Header.Set(DeliveryHeader, d.ID)
	req.Header.Set(EventHeader, string(d.Kind))
	req.Header.Set(AttemptHeader, strconv.Itoa(attempt))
	resp, err := h.cfg.HTTPClient.Do(req)
	if err != nil {
		var ue *url.Error // its message holds the URL, which may hold credentials
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return 0, 0, fmt.Errorf("webhook %s: %w", t.Name, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp.StatusCode, 0, nil
	}
	var after time.Duration
	if resp.StatusCode == http.StatusTooManyRequests {
		if n, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && n > 0 {
			after = time.Duration(n) * time.Second
		}
	}
	return resp.StatusCode, after, fmt.Errorf("webhook %s: HTTP %d", t.Name, resp.StatusCode)
}

// retryable reports whether an attempt that got code (0: no answer) may
// succeed later.
func retryable(code int) bool {
	return code == 0 || code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500
}

func (h *Hooks) record(ctx context.Context, id string) *Delivery {
	kv, err := h.open(ctx, &h.deliveries)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	e, err := kv.Get(ctx, id)
	if err != nil {
		return nil
	}
	var d Delivery
	if json.Unmarshal(e.Value(), &d) != nil {
		return nil
	}
	return &d
}

// save writes a delivery to the log. The log is for people: a failure to
// write it is logged, and the delivery goes on.
func (h *Hooks) save(ctx context.Context, d Delivery) {
	kv, err := h.open(ctx, &h.deliveries)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.cfg.Timeout)
		defer cancel()
		b, _ := json.Marshal(d)
		_, err = kv.Put(ctx, d.ID, b)
	}
	if err != nil {
		h.log.Warn("hooks: write the delivery log", "delivery", d.ID, "err", err)
	}
}

// MaxDeliveries bounds one read of the delivery log.
const MaxDeliveries = 1000

// Deliveries returns the deliveries of session id still in the log, newest
// event first, at most limit (1 to MaxDeliveries).
func (h *Hooks) Deliveries(ctx context.Context, id session.ID, limit int) ([]Delivery, error) {
	kv, err := h.open(ctx, &h.deliveries)
	if err != nil {
		return nil, unavailable(err)
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	lister, err := kv.ListKeysFiltered(ctx, string(id)+".>")
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return []Delivery{}, nil
		}
		return nil, unavailable(err)
	}
	type keyed struct {
		key    string
		seq    session.Seq
		target string
	}
	var keys []keyed
	for k := range lister.Keys() {
		parts := strings.SplitN(strings.TrimPrefix(k, string(id)+"."), ".", 2)
		if len(parts) != 2 {
			continue
		}
		seq, err := strconv.ParseInt(parts[0], 10, 64)
		if err != nil {
			continue
		}
		keys = append(keys, keyed{k, seq, parts[1]})
	}
	_ = lister.Stop()
	slices.SortFunc(keys, func(a, b keyed) int {
		if a.seq != b.seq {
			return cmp.Compare(b.seq, a.seq)
		}
		return strings.Compare(a.target, b.target)
	})
	if len(keys) > limit {
		keys = keys[:limit]
	}
	out := make([]Delivery, 0, len(keys))
	for _, k := range keys {
		e, err := kv.Get(ctx, k.key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, unavailable(err)
		}
		var d Delivery
		if json.Unmarshal(e.Value(), &d) == nil {
			out = append(out, d)
		}
	}
	return out, nil
}
