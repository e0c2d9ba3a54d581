package auth

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/session"
)

// DefaultTokenTTL is how long an API token made without an expiry lasts
// (TokensConfig.DefaultTTL).
const DefaultTokenTTL = 90 * 24 * time.Hour

// ownerKeyPrefix starts the keys of owner records in the token bucket; token
// ids never contain '_'.
const ownerKeyPrefix = "owner_"

// ownerRecord is what the store last learned of a token owner's claims at an
// interactive login (an OIDC ID or access token, a login cookie, the dev
// identity): a token never grants more than these.
type ownerRecord struct {
	User     string    `json:"user"`
	Tenant   string    `json:"tenant"`
	Admin    bool      `json:"admin,omitempty"`
	Operator bool      `json:"operator,omitempty"`
	SeenAt   time.Time `json:"seen_at"`
}

// ownerKey is the bucket key of user's owner record in tenant.
func ownerKey(tenant, user string) string {
	sum := sha256.Sum256([]byte(tenant + "\x00" + user))
	return ownerKeyPrefix + tokenEncoding.EncodeToString(sum[:20])
}

// NoteLogin records the claims p was authenticated with, unless p is an API
// token's: from then on the owner's tokens grant at most these (a user who
// left the admin group is no longer an admin through a token made before).
// It writes at most once per TouchEvery for unchanged claims, and logs
// rather than returns a store that cannot be reached: the request goes on.
func (t *Tokens) NoteLogin(ctx context.Context, p session.Principal) {
	if p.Via == session.ViaToken || p.User == "" {
		return
	}
	if err := t.noteLogin(ctx, p, false); err != nil {
		t.log.Warn("record login claims for API tokens", "user", p.User, "tenant", p.Tenant, "err", err)
	}
}

func (t *Tokens) noteLogin(ctx context.Context, p session.Principal, force bool) error {
	key := ownerKey(p.Tenant, p.User)
	now := t.cfg.Now()
	rec := ownerRecord{User: p.User, Tenant: p.Tenant, Admin: p.Admin, Operator: p.Operator, SeenAt: now.UTC()}
	t.mu.Lock()
	last, ok := t.owners[key]
	due := force || !ok || last.rec == nil || last.rec.Admin != rec.Admin || last.rec.Operator != rec.Operator ||
		now.Sub(last.rec.SeenAt) >= t.cfg.TouchEvery
	t.mu.Unlock()
	if !due {
		return nil
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	kv, err := t.open(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	if _, err := kv.Put(ctx, key, b); err != nil {
		return fmt.Errorf("store owner record: %w", err)
	}
	t.rememberOwner(key, &rec)
	return nil
}

// owner returns the owner record of user in tenant, nil if the store has
// none (a token made before owners were recorded).
func (t *Tokens) owner(ctx context.Context, tenant, user string) (*ownerRecord, error) {
	key := ownerKey(tenant, user)
	if t.cfg.CacheTTL > 0 {
		t.mu.Lock()
		c, ok := t.owners[key]
		t.mu.Unlock()
		if ok && t.cfg.Now().Sub(c.read) < t.cfg.CacheTTL {
			return c.rec, nil
		}
	}
	kv, err := t.open(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		t.rememberOwner(key, nil)
		return nil, nil
	}
	if err != nil {
		return nil, tokenStoreDown(fmt.Errorf("read owner record: %w", err))
	}
	var rec ownerRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, fmt.Errorf("decode owner record: %w", err)
	}
	t.rememberOwner(key, &rec)
	return &rec, nil
}

type cachedOwner struct {
	rec  *ownerRecord // nil: none
	read time.Time
}

func (t *Tokens) rememberOwner(key string, rec *ownerRecord) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.owners) >= tokenCacheMax {
		clear(t.owners)
	}
	t.owners[key] = cachedOwner{rec: rec, read: t.cfg.Now()}
}

// capByOwner lowers p, the principal of token rec, to its owner's latest
// claims, or refuses the token if its owner has not logged in for
// LoginMaxAge.
func (t *Tokens) capByOwner(ctx context.Context, rec *tokenRecord, p *session.Principal) error {
	o, err := t.owner(ctx, rec.Tenant, rec.User)
	if err != nil {
		return err
	}
	if o == nil {
		return nil
	}
	p.Admin = p.Admin && o.Admin
	p.Operator = p.Operator && o.Operator
	if max := t.cfg.LoginMaxAge; max > 0 && t.cfg.Now().Sub(o.SeenAt) > max {
		return session.Errorf(session.CodeUnauthenticated,
			"API token refused: its owner %s has not logged in since %s (the server wants a login every %s); log in, then use it again",
			rec.User, o.SeenAt.UTC().Format(time.RFC3339), max)
	}
	return nil
}

// RevokeUser deletes every API token of user in by's tenant: user must be by
// or by a tenant admin. It returns the revoked tokens. Through this gateway
// they stop working at once; through others within the cache TTL, and open
// connections within the gateway's token recheck.
func (t *Tokens) RevokeUser(ctx context.Context, by session.Principal, user string) ([]TokenInfo, error) {
	if by.Via == session.ViaToken {
		return nil, errRevokeByToken
	}
	if err := session.ValidUser(user); err != nil {
		return nil, session.Errorf(session.CodeBadRequest, "user: %s", session.AsError(err).Message)
	}
	if user != by.User && !by.Admin {
		return nil, session.Errorf(session.CodeForbidden, "revoking another user's tokens needs a tenant admin")
	}
	infos, err := t.list(ctx, func(r *tokenRecord) bool { return r.Tenant == by.Tenant && r.User == user })
	if err != nil {
		return nil, err
	}
	kv, err := t.open(ctx)
	if err != nil {
		return nil, err
	}
	for i, info := range infos {
		pctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
		err := kv.Purge(pctx, info.ID)
		cancel()
		if err != nil {
			return infos[:i], tokenStoreDown(fmt.Errorf("purge token %s: %w", info.ID, err))
		}
		t.mu.Lock()
		delete(t.cache, info.ID)
		delete(t.touched, info.ID)
		t.mu.Unlock()
	}
	return infos, nil
}

// isOwnerKey reports whether a bucket key is an owner record's.
func isOwnerKey(k string) bool { return strings.HasPrefix(k, ownerKeyPrefix) }
