package auth

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
)

// Defaults of TokensConfig and the shape of API tokens.
const (
	// DefaultTokensBucket is the NATS KV bucket of API tokens.
	DefaultTokensBucket = "atrium_tokens"
	// DefaultTokenCacheTTL is how long a gateway trusts what it read about a
	// token: a token revoked through another gateway stops working here
	// within this time (through this gateway, at once).
	DefaultTokenCacheTTL = 2 * time.Second
	// DefaultTokenTouchEvery is the granularity of last_used_at: a token's
	// record is written at most this often as it is used.
	DefaultTokenTouchEvery = time.Minute
	// DefaultMaxTokensPerUser bounds the tokens one user may hold.
	DefaultMaxTokensPerUser = 100
	// DefaultTokensTimeout bounds one read or write of the bucket.
	DefaultTokensTimeout = 5 * time.Second

	// TokenPrefix starts every API token: "atr_<id>_<secret>".
	TokenPrefix = "atr_"
	// MaxTokenNameBytes bounds a token's name.
	MaxTokenNameBytes = 100
)

// Sizes of a token's parts, in random bytes and in characters.
const (
	tokenIDBytes     = 10 // 80 bits: unique among tokens, never secret
	tokenSecretBytes = 32 // 256 bits
	tokenCacheMax    = 10000
)

var tokenEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

var (
	tokenIDLen     = tokenEncoding.EncodedLen(tokenIDBytes)
	tokenSecretLen = tokenEncoding.EncodedLen(tokenSecretBytes)
)

// TokensConfig configures Tokens. NATS is required.
type TokensConfig struct {
	// NATS is the connection whose JetStream holds the bucket. The caller
	// owns it.
	NATS *nats.Conn
	// Bucket names the KV bucket; default DefaultTokensBucket.
	Bucket string
	// Replicas is the bucket's replica count in a NATS cluster; default 1.
	Replicas int
	// CacheTTL is how long a token's record is used without reading it
	// again; default DefaultTokenCacheTTL. Negative means no cache.
	CacheTTL time.Duration
	// TouchEvery is the granularity of last_used_at; default
	// DefaultTokenTouchEvery.
	TouchEvery time.Duration
	// MaxPerUser bounds one user's tokens; default DefaultMaxTokensPerUser.
	MaxPerUser int
	// Timeout bounds one read or write of the bucket; default
	// DefaultTokensTimeout.
	Timeout time.Duration
	// DefaultTTL is how long a token made without an expiry lasts; default
	// DefaultTokenTTL. Negative: such tokens never expire.
	DefaultTTL time.Duration
	// LoginMaxAge, if positive, refuses a token whose owner has not logged
	// in interactively (an OIDC ID or access token, a login cookie) for
	// longer: a user deleted or disabled at the identity provider cannot log
	// in, so their tokens stop working after at most this. Zero: off.
	LoginMaxAge time.Duration
	// Now returns the current time; default time.Now.
	Now func() time.Time
	// Logger receives the store's logs; default slog.Default().
	Logger *slog.Logger
}

// TokenInfo is what may be shown about an API token: everything but its
// secret. It is the TokenInfo of the wire contract.
type TokenInfo = api.TokenInfo

// TokenRequest asks Tokens.Create for a token.
type TokenRequest struct {
	Name string
	// ExpiresAt is when the token stops working; zero means never.
	ExpiresAt time.Time
	// Role caps the token (see TokenInfo.Role); RoleNone means no cap.
	Role session.Role
}

// tokenRecord is a token as the bucket stores it: its info, whether its user
// was a tenant admin when it was created, and the SHA-256 of its secret.
type tokenRecord struct {
	TokenInfo
	Admin bool `json:"admin,omitempty"`
	// Operator: its user was an operator when it was created.
	Operator bool   `json:"operator,omitempty"`
	Hash     string `json:"hash"`
}

// Tokens is the store of Atrium API tokens, on a NATS KV bucket, and the
// Authenticator of "Authorization: Bearer atr_<id>_<secret>". A token acts as
// the user who created it, in that user's tenant, with the user's roles
// lowered to the token's cap, and as a tenant admin only if the user was one
// when the token was made. Its secret is shown once, at creation; the bucket
// keeps only its SHA-256.
//
// Create it with NewTokens; the bucket is created on first use, so
// NewTokens does no I/O. Tokens starts no goroutines.
type Tokens struct {
	cfg TokensConfig
	js  jetstream.JetStream
	log *slog.Logger

	kvMu sync.Mutex
	kv   jetstream.KeyValue // guarded by kvMu; nil until first opened

	mu      sync.Mutex
	cache   map[string]cachedToken // guarded by mu: by id
	touched map[string]time.Time   // guarded by mu: when this gateway last wrote last_used_at
	owners  map[string]cachedOwner // guarded by mu: owner records by key
}

type cachedToken struct {
	rec  tokenRecord
	read time.Time
}

var _ Authenticator = (*Tokens)(nil)

// NewTokens returns a token store on cfg.NATS.
func NewTokens(cfg TokensConfig) (*Tokens, error) {
	if cfg.NATS == nil {
		return nil, errors.New("auth: tokens config needs a NATS connection")
	}
	cfg.Bucket = cmp.Or(cfg.Bucket, DefaultTokensBucket)
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.CacheTTL == 0 {
		cfg.CacheTTL = DefaultTokenCacheTTL
	}
	if cfg.TouchEvery <= 0 {
		cfg.TouchEvery = DefaultTokenTouchEvery
	}
	if cfg.MaxPerUser <= 0 {
		cfg.MaxPerUser = DefaultMaxTokensPerUser
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTokensTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.DefaultTTL == 0 {
		cfg.DefaultTTL = DefaultTokenTTL
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	js, err := jetstream.New(cfg.NATS)
	if err != nil {
		return nil, fmt.Errorf("auth: open jetstream: %w", err)
	}
	return &Tokens{
		cfg: cfg, js: js, log: log,
		cache: make(map[string]cachedToken), touched: make(map[string]time.Time), owners: make(map[string]cachedOwner),
	}, nil
}

// bucket returns the KV bucket, creating it on first use.
func (t *Tokens) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	t.kvMu.Lock()
	defer t.kvMu.Unlock()
	if t.kv != nil {
		return t.kv, nil
	}
	kv, err := t.js.KeyValue(ctx, t.cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = t.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: t.cfg.Bucket, Description: "Atrium API tokens (hashes only)", History: 1,
			Storage: jetstream.FileStorage, Replicas: t.cfg.Replicas,
		})
	}
	if err != nil {
		return nil, fmt.Errorf("open token bucket %s: %w", t.cfg.Bucket, err)
	}
	t.kv = kv
	return kv, nil
}

// Errors of Tokens.
var (
	errTokenUnknown   = session.Errorf(session.CodeUnauthenticated, "invalid token: unknown or revoked API token")
	errTokenMalformed = session.Errorf(session.CodeUnauthenticated,
		"invalid token: a malformed API token; it looks like atr_<id>_<secret>; copy it again or create a new one with `atrium token create`")
	errTokenNotFound   = session.Errorf(session.CodeNotFound, "token not found")
	errTokensByToken   = session.Errorf(session.CodeForbidden, "API tokens cannot create tokens: log in")
	errRevokeByToken   = session.Errorf(session.CodeForbidden, "API tokens cannot revoke tokens: log in")
	errListAllNotAdmin = session.Errorf(session.CodeForbidden, "listing every token of the tenant needs a tenant admin")
)

// tokenStoreError is a wire error that keeps its cause for logs.
type tokenStoreError struct {
	wire  *session.Error
	cause error
}

func (e *tokenStoreError) Error() string   { return e.wire.Error() + ": " + e.cause.Error() }
func (e *tokenStoreError) Unwrap() []error { return []error{e.wire, e.cause} }

func tokenStoreDown(err error) error {
	return &tokenStoreError{
		wire:  session.Errorf(session.CodeUnavailable, "the API token store is unavailable: try again shortly"),
		cause: err,
	}
}

// Create makes a token for by, who must not be authenticated by a token
// itself, and returns it (the only time its secret is known) with its info.
// A request without an expiry gets DefaultTTL. by's claims are recorded as
// its owner's latest (see NoteLogin).
// The token's cap is req.Role, and no more than by's own cap; it is a tenant
// admin's only if by is one.
func (t *Tokens) Create(ctx context.Context, by session.Principal, req TokenRequest) (string, TokenInfo, error) {
	if by.Via == session.ViaToken {
		return "", TokenInfo{}, errTokensByToken
	}
	if err := session.ValidUser(by.User); err != nil {
		return "", TokenInfo{}, session.Errorf(session.CodeUnauthenticated, "no valid user to create a token for")
	}
	if err := validTokenName(req.Name); err != nil {
		return "", TokenInfo{}, err
	}
	role := req.Role
	if role != session.RoleNone && !role.Valid() {
		return "", TokenInfo{}, session.Errorf(session.CodeBadRequest, "unknown role %q: want viewer, driver or owner, or none for no cap", role)
	}
	if by.Cap != session.RoleNone {
		switch {
		case role == session.RoleNone:
			role = by.Cap
		case !by.Cap.AtLeast(role):
			return "", TokenInfo{}, session.Errorf(session.CodeForbidden,
				"a token cannot have more rights than you: your credential is limited to %s", by.Cap)
		}
	}
	now := t.cfg.Now().UTC()
	if !req.ExpiresAt.IsZero() && !req.ExpiresAt.After(now) {
		return "", TokenInfo{}, session.Errorf(session.CodeBadRequest, "expires_at %s is not in the future", req.ExpiresAt.UTC().Format(time.RFC3339))
	}
	expires := req.ExpiresAt
	if expires.IsZero() && t.cfg.DefaultTTL > 0 {
		expires = now.Add(t.cfg.DefaultTTL)
	}
	if err := t.noteLogin(ctx, by, false); err != nil {
		return "", TokenInfo{}, err
	}
	mine, err := t.list(ctx, func(r *tokenRecord) bool { return r.Tenant == by.Tenant && r.User == by.User })
	if err != nil {
		return "", TokenInfo{}, err
	}
	if len(mine) >= t.cfg.MaxPerUser {
		return "", TokenInfo{}, session.Errorf(session.CodeConflict,
			"you have %d API tokens, the most allowed: revoke one first", len(mine))
	}
	kv, err := t.open(ctx)
	if err != nil {
		return "", TokenInfo{}, err
	}
	for range 3 {
		id := tokenRandom(tokenIDBytes)
		secret := tokenRandom(tokenSecretBytes)
		rec := tokenRecord{
			TokenInfo: TokenInfo{
				ID: id, Name: req.Name, User: by.User, Tenant: by.Tenant, Role: role, CreatedAt: now,
			},
			Admin:    by.Admin,
			Operator: by.Operator,
			Hash:     tokenHash(secret),
		}
		if !expires.IsZero() {
			rec.ExpiresAt = expires.UTC()
		}
		b, err := json.Marshal(rec)
		if err != nil {
			return "", TokenInfo{}, fmt.Errorf("encode token record: %w", err)
		}
		cctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
		_, err = kv.Create(cctx, id, b)
		cancel()
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue // 80 random bits met: draw again.
		}
		if err != nil {
			return "", TokenInfo{}, tokenStoreDown(fmt.Errorf("store token %s: %w", id, err))
		}
		return TokenPrefix + id + "_" + secret, rec.TokenInfo, nil
	}
	return "", TokenInfo{}, session.Errorf(session.CodeInternal, "could not draw an unused token id")
}

func validTokenName(name string) error {
	switch {
	case strings.TrimSpace(name) == "":
		return session.Errorf(session.CodeBadRequest, `a token needs a "name" that says what uses it`)
	case len(name) > MaxTokenNameBytes:
		return session.Errorf(session.CodeBadRequest, "token name is longer than %d bytes", MaxTokenNameBytes)
	case strings.TrimSpace(name) != name:
		return session.Errorf(session.CodeBadRequest, "token name %q has surrounding whitespace", name)
	case strings.IndexFunc(name, unicode.IsControl) >= 0:
		return session.Errorf(session.CodeBadRequest, "token name has a control character")
	}
	return nil
}

// List returns by's tokens, or when all is set every token of by's tenant
// (tenant admins only), newest first.
func (t *Tokens) List(ctx context.Context, by session.Principal, all bool) ([]TokenInfo, error) {
	if all && !by.Admin {
		return nil, errListAllNotAdmin
	}
	return t.list(ctx, func(r *tokenRecord) bool {
		return r.Tenant == by.Tenant && (all || r.User == by.User)
	})
}

func (t *Tokens) list(ctx context.Context, keep func(*tokenRecord) bool) ([]TokenInfo, error) {
	kv, err := t.open(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, tokenStoreDown(fmt.Errorf("watch token bucket: %w", err))
	}
	defer func() { _ = w.Stop() }()
	out := []TokenInfo{}
	for {
		select {
		case <-ctx.Done():
			return nil, tokenStoreDown(fmt.Errorf("read token bucket: %w", ctx.Err()))
		case e, ok := <-w.Updates():
			if !ok {
				return nil, tokenStoreDown(errors.New("read token bucket: watcher stopped"))
			}
			if e == nil {
				slices.SortFunc(out, func(a, b TokenInfo) int {
					return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), strings.Compare(a.ID, b.ID))
				})
				return out, nil
			}
			if isOwnerKey(e.Key()) {
				continue
			}
			var rec tokenRecord
			if err := json.Unmarshal(e.Value(), &rec); err != nil {
				t.log.Warn("skip undecodable token record", "id", e.Key(), "err", err)
				continue
			}
			if keep(&rec) {
				out = append(out, rec.TokenInfo)
			}
		}
	}
}

// Revoke deletes token id, which must be by's own or, for a tenant admin,
// any token of its tenant; any other id is not found. Tokens cannot revoke
// tokens. It returns what the token was. Through this gateway the token
// stops working at once; through others within the cache TTL.
func (t *Tokens) Revoke(ctx context.Context, by session.Principal, id string) (TokenInfo, error) {
	if by.Via == session.ViaToken {
		return TokenInfo{}, errRevokeByToken
	}
	if !validTokenID(id) {
		return TokenInfo{}, errTokenNotFound
	}
	rec, _, err := t.read(ctx, id)
	if err != nil {
		return TokenInfo{}, err
	}
	if rec == nil || rec.Tenant != by.Tenant || (rec.User != by.User && !by.Admin) {
		return TokenInfo{}, errTokenNotFound
	}
	kv, err := t.open(ctx)
	if err != nil {
		return TokenInfo{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	if err := kv.Purge(ctx, id); err != nil {
		return TokenInfo{}, tokenStoreDown(fmt.Errorf("purge token %s: %w", id, err))
	}
	t.mu.Lock()
	delete(t.cache, id)
	delete(t.touched, id)
	t.mu.Unlock()
	return rec.TokenInfo, nil
}

// Authenticate implements Authenticator for "Authorization: Bearer atr_…".
// Any other request has no credentials of this kind (ErrNoCredentials).
func (t *Tokens) Authenticate(r *http.Request) (session.Principal, error) {
	h := r.Header.Get("Authorization")
	const scheme = "bearer "
	if len(h) < len(scheme) || !strings.EqualFold(h[:len(scheme)], scheme) {
		return session.Principal{}, ErrNoCredentials
	}
	tok := strings.TrimSpace(h[len(scheme):])
	if !strings.HasPrefix(tok, TokenPrefix) {
		return session.Principal{}, ErrNoCredentials
	}
	return t.Verify(r.Context(), tok)
}

// Verify returns the principal of API token tok, or an unauthenticated error
// that says why it is refused (malformed, unknown or revoked, expired).
func (t *Tokens) Verify(ctx context.Context, tok string) (session.Principal, error) {
	id, secret, ok := parseToken(tok)
	if !ok {
		return session.Principal{}, errTokenMalformed
	}
	rec, rev, err := t.lookup(ctx, id)
	if err != nil {
		return session.Principal{}, err
	}
	if rec == nil || subtle.ConstantTimeCompare([]byte(tokenHash(secret)), []byte(rec.Hash)) != 1 {
		return session.Principal{}, errTokenUnknown
	}
	now := t.cfg.Now()
	if !rec.ExpiresAt.IsZero() && !now.Before(rec.ExpiresAt) {
		return session.Principal{}, session.Errorf(session.CodeUnauthenticated,
			"API token expired at %s: create a new one with `atrium token create`", rec.ExpiresAt.UTC().Format(time.RFC3339))
	}
	if err := t.touch(ctx, id, now, rec, rev); err != nil {
		return session.Principal{}, err
	}
	p := session.Principal{
		User: rec.User, Tenant: rec.Tenant, Admin: rec.Admin, Operator: rec.Operator, Cap: rec.Role,
		Via: session.ViaToken, Expires: rec.ExpiresAt,
	}
	if err := t.capByOwner(ctx, rec, &p); err != nil {
		return session.Principal{}, err
	}
	return p, nil
}

// parseToken splits "atr_<id>_<secret>".
func parseToken(tok string) (id, secret string, ok bool) {
	rest, ok := strings.CutPrefix(tok, TokenPrefix)
	if !ok {
		return "", "", false
	}
	id, secret, ok = strings.Cut(rest, "_")
	if !ok || !validTokenID(id) || len(secret) != tokenSecretLen || !tokenChars(secret) {
		return "", "", false
	}
	return id, secret, true
}

func validTokenID(id string) bool { return len(id) == tokenIDLen && tokenChars(id) }

func tokenChars(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && (c < '2' || c > '7') {
			return false
		}
	}
	return true
}

func tokenRandom(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand never fails on Linux.
	return tokenEncoding.EncodeToString(b)
}

func tokenHash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return base64.RawStdEncoding.EncodeToString(sum[:])
}

// open returns the bucket or an unavailable error.
func (t *Tokens) open(ctx context.Context) (jetstream.KeyValue, error) {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	kv, err := t.bucket(ctx)
	if err != nil {
		return nil, tokenStoreDown(err)
	}
	return kv, nil
}

// lookup returns id's record from the cache if it is fresh (revision 0),
// else from the bucket with its revision; nil if there is none.
func (t *Tokens) lookup(ctx context.Context, id string) (*tokenRecord, uint64, error) {
	if t.cfg.CacheTTL > 0 {
		t.mu.Lock()
		c, ok := t.cache[id]
		t.mu.Unlock()
		if ok && t.cfg.Now().Sub(c.read) < t.cfg.CacheTTL {
			return &c.rec, 0, nil
		}
	}
	return t.read(ctx, id)
}

// read returns id's record and revision from the bucket, nil if there is
// none, and caches what it found.
func (t *Tokens) read(ctx context.Context, id string) (*tokenRecord, uint64, error) {
	kv, err := t.open(ctx)
	if err != nil {
		return nil, 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	e, err := kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		t.mu.Lock()
		delete(t.cache, id)
		t.mu.Unlock()
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, tokenStoreDown(fmt.Errorf("read token %s: %w", id, err))
	}
	var rec tokenRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, 0, fmt.Errorf("decode token %s: %w", id, err)
	}
	t.remember(id, rec)
	return &rec, e.Revision(), nil
}

func (t *Tokens) remember(id string, rec tokenRecord) {
	if t.cfg.CacheTTL <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.cache) >= tokenCacheMax {
		clear(t.cache) // a burst of tokens; they are read again as used.
	}
	t.cache[id] = cachedToken{rec: rec, read: t.cfg.Now()}
}

// touch records that id was used at now, at most once per TouchEvery from
// this gateway. It needs the record at revision rev as the bucket has it; a
// cached record (rev 0) is read again first, so a token revoked elsewhere is
// found out here too. The record is written back only if nobody changed it
// since.
func (t *Tokens) touch(ctx context.Context, id string, now time.Time, rec *tokenRecord, rev uint64) error {
	t.mu.Lock()
	last, ok := t.touched[id]
	due := !ok || now.Sub(last) >= t.cfg.TouchEvery
	if due {
		if len(t.touched) >= tokenCacheMax {
			clear(t.touched)
		}
		t.touched[id] = now
	}
	t.mu.Unlock()
	if !due {
		return nil
	}
	if rev == 0 {
		var err error
		if rec, rev, err = t.read(ctx, id); err != nil {
			return err
		}
		if rec == nil {
			return errTokenUnknown
		}
	}
	if now.Sub(rec.LastUsedAt) < t.cfg.TouchEvery {
		return nil // another gateway wrote it a moment ago.
	}
	next := *rec
	next.LastUsedAt = now.UTC()
	b, err := json.Marshal(next)
	if err != nil {
		return fmt.Errorf("encode token record: %w", err)
	}
	kv, err := t.open(ctx)
	if err != nil {
		return err
	}
	uctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	if _, err := kv.Update(uctx, id, b, rev); err != nil {
		// Revoked or touched by someone else in between: the next use
		// tells. last_used_at is best effort; the request is not refused.
		t.log.Debug("update token last_used_at", "id", id, "err", err)
		return nil
	}
	t.remember(id, next)
	return nil
}
