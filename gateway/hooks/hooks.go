// Package hooks is Atrium's signed webhooks. Inbound, POST /v1/hooks/{name}
// accepts a JSON body signed with the hook's secret (HMAC-SHA256 over the
// timestamp and the body, in the X-Atrium-Signature header, within a
// five-minute replay window) and turns it into a prompt, in a new session or
// in the session its key maps to, as the user the hook is configured to act
// as; a request repeated with the same Idempotency-Key (or the same
// signature) gets the first answer again and does nothing more. Outbound,
// the events of a session subscribed to a target are POSTed to the target's
// URL, signed the same way, retried with backoff, and recorded in a delivery
// log that owners read through the gateway.
//
// Deliveries are driven by package channel, like chat messages: Hooks
// implements channel.Webhooks.
package hooks

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"sync"
	"text/template"
	"time"

	"github.com/atriumhq/atrium/gateway/channel"
	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of Config.
const (
	// DefaultWindow is how far a signature's timestamp may be from now.
	DefaultWindow = 5 * time.Minute
	// DefaultIdempotencyTTL is how long an answer is kept for requests
	// repeated with the same Idempotency-Key.
	DefaultIdempotencyTTL = 24 * time.Hour
	// DefaultLogTTL is how long the delivery log keeps a delivery.
	DefaultLogTTL = 7 * 24 * time.Hour
	// DefaultAttempts bounds the tries of one outbound delivery.
	DefaultAttempts = 12
	// DefaultDeliveryTimeout bounds one outbound POST.
	DefaultDeliveryTimeout = 10 * time.Second
	// DefaultTimeout bounds one read or write of a bucket.
	DefaultTimeout = 5 * time.Second
	// DefaultPrompt is the prompt template of a hook that sets none.
	DefaultPrompt = "{{.text}}"
)

// IdempotencyHeader names a request so that repeating it is harmless.
const IdempotencyHeader = "Idempotency-Key"

// Headers of outbound deliveries, besides SignatureHeader.
const (
	DeliveryHeader = "X-Atrium-Delivery"
	EventHeader    = "X-Atrium-Event"
	AttemptHeader  = "X-Atrium-Attempt"
)

// Config configures Hooks. NATS is required.
type Config struct {
	// NATS is the connection whose JetStream holds the buckets
	// "<prefix>_hook_idempotency", "<prefix>_hook_sessions" and
	// "<prefix>_hook_deliveries". The caller owns it.
	NATS *nats.Conn
	// Prefix of the buckets; default session.DefaultPrefix.
	Prefix string
	// Hooks are the inbound webhooks.
	Hooks []Hook
	// Targets are where outbound webhooks go.
	Targets []Target
	// Window is the replay window of signatures; default DefaultWindow.
	Window time.Duration
	// IdempotencyTTL and LogTTL: see the Default constants.
	IdempotencyTTL time.Duration
	LogTTL         time.Duration
	// Attempts bounds the tries of one delivery; default DefaultAttempts.
	Attempts int
	// HTTPClient makes deliveries; default a client with a
	// DefaultDeliveryTimeout timeout that does not follow redirects.
	HTTPClient *http.Client
	// Timeout bounds one read or write of a bucket; default DefaultTimeout.
	Timeout time.Duration
	// Replicas is the JetStream replica count of the buckets; default 1.
	Replicas int
	// Now returns the current time; default time.Now.
	Now func() time.Time
	// Logger receives the logs; default slog.Default().
	Logger *slog.Logger
}

// Hook is an inbound webhook, served at POST /v1/hooks/<Name>.
type Hook struct {
	// Name is the hook's path segment: letters, digits, '_' and '-'.
	Name string
	// Secret signs the requests. Secret: never logged.
	Secret string
	// User and Tenant are who the hook acts as: it can do what that user
	// can, and the sessions it starts are that user's.
	User, Tenant string
	// Prompt is a text/template over the JSON body that makes the prompt;
	// default DefaultPrompt. A field the body lacks is an error (400).
	Prompt string
	// Title makes the title of a new session; default "Webhook <name>".
	Title string
	// SessionKey, if set, is a template whose value picks the session:
	// requests with the same key go to the same session (the first one
	// starts it). Unset, every request starts a session.
	SessionKey string
	// DeliverTo, if set, subscribes the sessions the hook starts to this
	// target, for DeliverKinds (every kind, if empty).
	DeliverTo    string
	DeliverKinds []session.Kind
}

// Target is where outbound webhooks are delivered.
type Target struct {
	// Name is how subscriptions name it: letters, digits, '_' and '-'.
	Name string
	// URL receives the POSTs. It may hold credentials: it is never logged
	// or shown.
	URL string
	// Secret signs the deliveries. Secret.
	Secret string
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Hooks serves inbound webhooks and delivers outbound ones. It starts no
// goroutines.
type Hooks struct {
	cfg     Config
	log     *slog.Logger
	js      jetstream.JetStream
	hooks   map[string]*hook
	targets map[string]Target

	idem, keys, deliveries bucket
}

// hook is a Hook with its templates parsed.
type hook struct {
	Hook
	prompt, title, key *template.Template
}

var _ channel.Webhooks = (*Hooks)(nil)

// New checks cfg and returns Hooks.
func New(cfg Config) (*Hooks, error) {
	if cfg.NATS == nil {
		return nil, errors.New("hooks: config needs a NATS connection")
	}
	cfg.Prefix = cmp.Or(cfg.Prefix, session.DefaultPrefix)
	cfg.Window = cmp.Or(cfg.Window, DefaultWindow)
	cfg.IdempotencyTTL = cmp.Or(cfg.IdempotencyTTL, DefaultIdempotencyTTL)
	cfg.LogTTL = cmp.Or(cfg.LogTTL, DefaultLogTTL)
	cfg.Attempts = cmp.Or(cfg.Attempts, DefaultAttempts)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{
			Timeout:       DefaultDeliveryTimeout,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	h := &Hooks{cfg: cfg, log: cfg.Logger, hooks: make(map[string]*hook), targets: make(map[string]Target)}
	for i, t := range cfg.Targets {
		switch {
		case !nameRE.MatchString(t.Name):
			return nil, fmt.Errorf("hooks: targets[%d]: name %q: use 1 to 64 letters, digits, '_' or '-'", i, t.Name)
		case t.URL == "":
			return nil, fmt.Errorf("hooks: target %s needs a url", t.Name)
		case len(t.Secret) < 16:
			return nil, fmt.Errorf("hooks: target %s needs a secret of at least 16 characters (openssl rand -hex 32)", t.Name)
		}
		if _, dup := h.targets[t.Name]; dup {
			return nil, fmt.Errorf("hooks: two targets are named %s", t.Name)
		}
		h.targets[t.Name] = t
	}
	for i, c := range cfg.Hooks {
		switch {
		case !nameRE.MatchString(c.Name):
			return nil, fmt.Errorf("hooks: hooks[%d]: name %q: use 1 to 64 letters, digits, '_' or '-'", i, c.Name)
		case len(c.Secret) < 16:
			return nil, fmt.Errorf("hooks: hook %s needs a secret of at least 16 characters (openssl rand -hex 32)", c.Name)
		case c.User == "" || c.Tenant == "":
			return nil, fmt.Errorf("hooks: hook %s needs the user and tenant it acts as", c.Name)
		case c.DeliverTo != "" && h.targets[c.DeliverTo].Name == "":
			return nil, fmt.Errorf("hooks: hook %s delivers to %s, which is not a target", c.Name, c.DeliverTo)
		}
		if err := session.ValidUser(c.User); err != nil {
			return nil, fmt.Errorf("hooks: hook %s: %w", c.Name, err)
		}
		if _, dup := h.hooks[c.Name]; dup {
			return nil, fmt.Errorf("hooks: two hooks are named %s", c.Name)
		}
		hk := &hook{Hook: c}
		var err error
		if hk.prompt, err = parse(c.Name, "prompt", cmp.Or(c.Prompt, DefaultPrompt)); err != nil {
			return nil, err
		}
		if hk.title, err = parse(c.Name, "title", cmp.Or(c.Title, "Webhook "+c.Name)); err != nil {
			return nil, err
		}
		if c.SessionKey != "" {
			if hk.key, err = parse(c.Name, "session_key", c.SessionKey); err != nil {
				return nil, err
			}
		}
		h.hooks[c.Name] = hk
	}
	js, err := jetstream.New(cfg.NATS)
	if err != nil {
		return nil, fmt.Errorf("hooks: open jetstream: %w", err)
	}
	h.js = js
	replicas := max(cfg.Replicas, 1)
	h.idem.cfg = jetstream.KeyValueConfig{Bucket: cfg.Prefix + "_hook_idempotency",
		Description: "Atrium inbound webhook answers, by idempotency key", TTL: cfg.IdempotencyTTL, Replicas: replicas}
	h.keys.cfg = jetstream.KeyValueConfig{Bucket: cfg.Prefix + "_hook_sessions",
		Description: "Atrium inbound webhook session keys", Replicas: replicas}
	h.deliveries.cfg = jetstream.KeyValueConfig{Bucket: cfg.Prefix + "_hook_deliveries",
		Description: "Atrium outbound webhook delivery log", TTL: cfg.LogTTL, Replicas: replicas}
	return h, nil
}

func parse(hook, what, text string) (*template.Template, error) {
	t, err := template.New(what).Option("missingkey=error").Funcs(template.FuncMap{
		"json": func(v any) (string, error) {
			b, err := json.Marshal(v)
			return string(b), err
		},
	}).Parse(text)
	if err != nil {
		return nil, fmt.Errorf("hooks: hook %s: %s template: %w", hook, what, err)
	}
	return t, nil
}

// HasTarget reports whether name is a configured target.
func (h *Hooks) HasTarget(name string) bool {
	_, ok := h.targets[name]
	return ok
}

// bucket is a KV bucket opened (or created) on first use.
type bucket struct {
	cfg jetstream.KeyValueConfig

	mu sync.Mutex
	kv jetstream.KeyValue // guarded by mu
}

func (h *Hooks) open(ctx context.Context, b *bucket) (jetstream.KeyValue, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.kv != nil {
		return b.kv, nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.cfg.Timeout)
	defer cancel()
	kv, err := h.js.CreateOrUpdateKeyValue(ctx, b.cfg)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", b.cfg.Bucket, err)
	}
	b.kv = kv
	return kv, nil
}

func render(t *template.Template, data any) (string, error) {
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		return "", err
	}
	return b.String(), nil
}
