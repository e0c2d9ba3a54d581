package audit

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/session"
)

// Defaults of Config and limits of List.
const (
	// DefaultStream is the name of the JetStream stream of the audit log.
	DefaultStream = "ATRIUM_AUDIT"
	// DefaultMaxAge is how long entries are kept: a little over a year.
	DefaultMaxAge = 400 * 24 * time.Hour
	// DefaultTimeout bounds one write or one read of the stream.
	DefaultTimeout = 5 * time.Second
	// DefaultLimit and MaxLimit bound the entries of one List page.
	DefaultLimit = 100
	MaxLimit     = 1000
	// MaxDetailBytes bounds Entry.Detail; longer details are cut.
	MaxDetailBytes = 512
)

// maxScan bounds the entries of a tenant that one List call reads; a page
// whose filters match rarely may come back short, with a cursor to go on.
const maxScan = 20000

// Config configures a Log. NATS is required.
type Config struct {
	// NATS is the connection to the NATS system whose JetStream holds the
	// log. The caller owns it.
	NATS *nats.Conn
	// Stream names the stream; default DefaultStream.
	Stream string
	// Prefix is the subject prefix (session.Subjects.Prefix): entries of
	// a tenant go to "<prefix>.audit.<tenant token>". Default
	// session.DefaultPrefix.
	Prefix string
	// MaxAge is how long entries are kept; default DefaultMaxAge.
	MaxAge time.Duration
	// MaxBytes bounds the stream's size, oldest entries going first; 0
	// means no bound other than MaxAge.
	MaxBytes int64
	// Replicas is the stream's replica count in a NATS cluster; default 1.
	Replicas int
	// Timeout bounds one write or read of the stream; default
	// DefaultTimeout.
	Timeout time.Duration
	// Now returns the current time; default time.Now.
	Now func() time.Time
}

// Log is the durable audit log: one JetStream stream (file storage) with a
// subject per tenant. It implements Recorder. Create it with New; it creates
// or updates its stream on first use, so New does no I/O.
type Log struct {
	cfg Config
	js  jetstream.JetStream

	mu     sync.Mutex
	stream jetstream.Stream // guarded by mu; nil until first opened
}

var _ Recorder = (*Log)(nil)

// Filter selects entries of a tenant in List. Zero fields select all.
type Filter struct {
	Actor   string
	Action  string
	Session string
	// Since and Until bound an entry's Time: Since <= Time <= Until.
	Since, Until time.Time
	// Cursor is the "next" of the previous page; "" starts at the newest.
	Cursor string
	// Limit is the most entries to return; default DefaultLimit, at most
	// MaxLimit.
	Limit int
}

// New returns a Log on cfg.NATS.
func New(cfg Config) (*Log, error) {
	if cfg.NATS == nil {
		return nil, errors.New("audit: config needs a NATS connection")
	}
	if cfg.Stream == "" {
		cfg.Stream = DefaultStream
	}
	if cfg.Prefix == "" {
		cfg.Prefix = session.DefaultPrefix
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxBytes < 0 {
		return nil, fmt.Errorf("audit: MaxBytes must not be negative, not %d", cfg.MaxBytes)
	}
	js, err := jetstream.New(cfg.NATS)
	if err != nil {
		return nil, fmt.Errorf("audit: open jetstream: %w", err)
	}
	return &Log{cfg: cfg, js: js}, nil
}

// open returns the stream, creating or updating it on first use.
func (l *Log) open(ctx context.Context) (jetstream.Stream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stream != nil {
		return l.stream, nil
	}
	maxBytes := l.cfg.MaxBytes
	if maxBytes == 0 {
		maxBytes = -1
	}
	st, err := l.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        l.cfg.Stream,
		Description: "Atrium audit log",
		Subjects:    []string{l.cfg.Prefix + ".audit.>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      l.cfg.MaxAge,
		MaxBytes:    maxBytes,
		Replicas:    l.cfg.Replicas,
		Duplicates:  2 * time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("open audit stream %s: %w", l.cfg.Stream, err)
	}
	l.stream = st
	return st, nil
}

// subject returns the subject of tenant's entries. Tenants are names from an
// identity provider, so they are encoded to be safe as one subject token.
func (l *Log) subject(tenant string) string {
	tok := "_"
	if tenant != "" {
		tok = "t" + base64.RawURLEncoding.EncodeToString([]byte(tenant))
	}
	return l.cfg.Prefix + ".audit." + tok
}

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

func newID() string {
	b := make([]byte, 10)
	_, _ = rand.Read(b) // crypto/rand never fails on Linux.
	return "au_" + idEncoding.EncodeToString(b)
}

// Record implements Recorder: it appends e to its tenant's log and returns
// once the stream has stored it. ID and Time are set when empty, Outcome
// defaults to OK, and Detail is cut to MaxDetailBytes.
func (l *Log) Record(ctx context.Context, e Entry) error {
	if e.Action == "" {
		return errors.New("audit: record: entry has no action")
	}
	if e.ID == "" {
		e.ID = newID()
	}
	if e.Time.IsZero() {
		e.Time = l.cfg.Now()
	}
	e.Time = e.Time.UTC()
	if e.Outcome == "" {
		e.Outcome = OK
	}
	e.Detail = cut(e.Detail, MaxDetailBytes)
	data, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("audit: encode %s entry: %w", e.Action, err)
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	if _, err := l.open(ctx); err != nil {
		return fmt.Errorf("audit: record %s: %w", e.Action, err)
	}
	if _, err := l.js.Publish(ctx, l.subject(e.Tenant), data, jetstream.WithMsgID(e.ID)); err != nil {
		return fmt.Errorf("audit: record %s: %w", e.Action, err)
	}
	return nil
}

// cut shortens s to at most n bytes without splitting a character.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// ErrBadCursor means List was given a cursor it did not make. It matches
// session.ErrBadRequest.
var ErrBadCursor = session.Errorf(session.CodeBadRequest, `invalid cursor: pass the "next" of the previous page`)

// List returns tenant's entries that match f, newest first, and the cursor
// of the next page ("" when there is none). A page has at most f.Limit
// entries; when the filters match rarely, a page may be short (even empty)
// and still have a next cursor: keep following it until it is "".
func (l *Log) List(ctx context.Context, tenant string, f Filter) ([]Entry, string, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultLimit
	}
	limit = min(limit, MaxLimit)
	var hi uint64 // entries before hi (a stream sequence) are read
	if f.Cursor != "" {
		n, err := strconv.ParseUint(f.Cursor, 36, 64)
		if err != nil || n == 0 {
			return nil, "", ErrBadCursor
		}
		hi = n
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	st, err := l.open(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("audit: list: %w", err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("audit: list: read stream info: %w", err)
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	if last == 0 || info.State.Msgs == 0 {
		return []Entry{}, "", nil
	}
	if hi == 0 || hi > last+1 {
		hi = last + 1
	}
	subj := l.subject(tenant)
	var (
		out     []stored // matches, newest first
		scanned int
		window  = uint64(4 * (limit + 1))
	)
	for hi > first {
		lo := first
		if hi-first > window {
			lo = hi - window
		}
		got, err := l.read(ctx, st, subj, lo, hi)
		if err != nil {
			return nil, "", err
		}
		scanned += len(got)
		done := false
		for i := len(got) - 1; i >= 0; i-- {
			if !f.Since.IsZero() && got[i].e.Time.Before(f.Since) {
				done = true // older entries are older still.
				continue
			}
			if f.match(&got[i].e) {
				out = append(out, got[i])
			}
		}
		hi = lo
		switch {
		case len(out) > limit:
			return entries(out[:limit]), strconv.FormatUint(out[limit-1].seq, 36), nil
		case done || hi <= first:
			return entries(out), "", nil
		case scanned >= maxScan:
			return entries(out), strconv.FormatUint(hi, 36), nil
		}
		window *= 2
	}
	return entries(out), "", nil
}

// stored is an entry and its stream sequence.
type stored struct {
	seq uint64
	e   Entry
}

func entries(s []stored) []Entry {
	out := make([]Entry, len(s))
	for i := range s {
		out[i] = s[i].e
	}
	return out
}

func (f *Filter) match(e *Entry) bool {
	return (f.Actor == "" || e.Actor == f.Actor) &&
		(f.Action == "" || e.Action == f.Action) &&
		(f.Session == "" || e.Session == f.Session) &&
		(f.Until.IsZero() || !e.Time.After(f.Until))
}

// readBatch is how many messages one fetch of read asks for.
const readBatch = 256

// read returns the entries of subj with stream sequences in [lo, hi), oldest
// first, through a short-lived consumer.
func (l *Log) read(ctx context.Context, st jetstream.Stream, subj string, lo, hi uint64) ([]stored, error) {
	cons, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject:     subj,
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       lo,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: time.Minute, // removed by the server if the delete below is lost.
		MemoryStorage:     true,
	})
	if err != nil {
		return nil, fmt.Errorf("audit: list: create consumer: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.Timeout)
		defer cancel()
		_ = st.DeleteConsumer(dctx, cons.CachedInfo().Name) // best effort: it expires anyway.
	}()
	var out []stored
	for {
		batch, err := cons.FetchNoWait(readBatch)
		if err != nil {
			return nil, fmt.Errorf("audit: list: fetch: %w", err)
		}
		n, done := 0, false
		for msg := range batch.Messages() {
			n++
			md, err := msg.Metadata()
			if err != nil {
				return nil, fmt.Errorf("audit: list: read metadata: %w", err)
			}
			if md.Sequence.Stream >= hi {
				done = true
				continue
			}
			var e Entry
			if err := json.Unmarshal(msg.Data(), &e); err != nil {
				continue // not an entry this package wrote; skip it.
			}
			out = append(out, stored{seq: md.Sequence.Stream, e: e})
			if md.NumPending == 0 {
				done = true
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, fmt.Errorf("audit: list: fetch: %w", err)
		}
		if done || n == 0 {
			return out, nil // a consumer delivers in stream order.
		}
	}
}
