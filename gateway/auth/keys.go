package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// How often the issuer's published keys are fetched again.
const (
	// keyRefetchInterval is the least time between two fetches caused by
	// tokens whose key is not known, so a flood of tokens with made-up key
	// ids cannot turn into a flood of requests to the provider.
	keyRefetchInterval = 10 * time.Second
	// keyMaxAge is how long fetched keys are used before they are fetched
	// again, so a key the provider withdrew stops being trusted.
	keyMaxAge = time.Hour
	// maxJWKSBytes bounds the key set document.
	maxJWKSBytes = 1 << 20
)

// keySet is the issuer's signing keys, fetched from its jwks_uri. It is the
// oidc.KeySet of the verifier: go-oidc checks issuer, algorithm and expiry;
// keySet checks signatures and says precisely why one fails (an unknown key,
// a bad signature, a provider that cannot be reached), which go-oidc's own
// RemoteKeySet reports only as text.
//
// A token signed with a key id that is not known makes keySet fetch the keys
// again (at most once per keyRefetchInterval): that is how key rotation is
// picked up.
type keySet struct {
	url    string
	client *http.Client
	now    func() time.Time
	algs   []jose.SignatureAlgorithm
	log    *slog.Logger

	fetchMu sync.Mutex // held while fetching; serialises fetches

	mu      sync.Mutex
	keys    []jose.JSONWebKey // guarded by mu
	fetched time.Time         // guarded by mu; when the keys were last fetched
	tried   time.Time         // guarded by mu; when a fetch was last tried
	gen     int               // guarded by mu; counts fetch attempts
	lastErr error             // guarded by mu; the last fetch's error
}

// errBadSignature means a known key's signature check failed: the token was
// altered, or signed by someone else with the same key id.
var errBadSignature = errors.New("signature does not verify")

// unknownKeyError means no key the issuer publishes has the token's key id.
type unknownKeyError struct{ kid string }

func (e *unknownKeyError) Error() string { return fmt.Sprintf("unknown signing key %q", e.kid) }

// keysUnavailableError means the issuer's keys could not be fetched.
type keysUnavailableError struct{ err error }

func (e *keysUnavailableError) Error() string { return "fetch signing keys: " + e.err.Error() }
func (e *keysUnavailableError) Unwrap() error { return e.err }

// keyNote carries keySet's error past go-oidc, which keeps only its text.
type keyNote struct{ err error }

type keyNoteKey struct{}

// VerifySignature implements oidc.KeySet.
func (k *keySet) VerifySignature(ctx context.Context, raw string) ([]byte, error) {
	payload, err := k.verify(ctx, raw)
	if err != nil {
		if n, ok := ctx.Value(keyNoteKey{}).(*keyNote); ok {
			n.err = err
		}
	}
	return payload, err
}

func (k *keySet) verify(ctx context.Context, raw string) ([]byte, error) {
	jws, err := jose.ParseSigned(raw, k.algs)
	if err != nil {
		return nil, fmt.Errorf("parse token: %w", err)
	}
	if len(jws.Signatures) != 1 {
		return nil, errors.New("a token must have exactly one signature")
	}
	kid := jws.Signatures[0].Header.KeyID

	c := k.cached()
	keys, gen, tried := c.keys, c.gen, c.tried
	now := k.now()
	if c.fetched.IsZero() || now.Sub(c.fetched) > keyMaxAge {
		// No keys yet, or old ones: fetch, but not more often than
		// keyRefetchInterval. Old keys still serve while the provider
		// cannot be reached.
		switch {
		case now.Sub(tried) >= keyRefetchInterval || tried.IsZero():
			fresh, err := k.fetch(ctx, gen)
			if err == nil {
				keys, gen = fresh, gen+1
			} else if c.fetched.IsZero() {
				return nil, err
			}
			tried = now
		case c.fetched.IsZero():
			return nil, c.lastErr
		}
	}
	payload, known := verifyWith(jws, keys, kid)
	if payload != nil {
		return payload, nil
	}
	if known && kid != "" {
		return nil, errBadSignature
	}
	// Not a key we know: perhaps the provider rotated its keys.
	if now.Sub(tried) >= keyRefetchInterval {
		fresh, err := k.fetch(ctx, gen)
		if err != nil {
			return nil, err
		}
		if payload, known = verifyWith(jws, fresh, kid); payload != nil {
			return payload, nil
		}
	}
	if known {
		return nil, errBadSignature
	}
	return nil, &unknownKeyError{kid: kid}
}

// verifyWith checks jws against the keys with its key id (all keys if it has
// none). known reports whether there was any such key.
func verifyWith(jws *jose.JSONWebSignature, keys []jose.JSONWebKey, kid string) (payload []byte, known bool) {
	for i := range keys {
		if kid != "" && keys[i].KeyID != kid {
			continue
		}
		known = true
		if p, err := jws.Verify(&keys[i]); err == nil {
			return p, true
		}
	}
	return nil, known
}

// keyCache is a snapshot of a keySet's state.
type keyCache struct {
	keys           []jose.JSONWebKey
	gen            int
	fetched, tried time.Time
	lastErr        error
}

func (k *keySet) cached() keyCache {
	k.mu.Lock()
	defer k.mu.Unlock()
	return keyCache{keys: k.keys, gen: k.gen, fetched: k.fetched, tried: k.tried, lastErr: k.lastErr}
}

// fetch fetches the keys, unless another caller did since the caller saw
// generation gen: then it returns that fetch's result.
func (k *keySet) fetch(ctx context.Context, gen int) ([]jose.JSONWebKey, error) {
	k.fetchMu.Lock()
	defer k.fetchMu.Unlock()
	k.mu.Lock()
	if k.gen != gen {
		keys, err := k.keys, k.lastErr
		k.mu.Unlock()
		return keys, err
	}
	k.mu.Unlock()

	keys, err := k.get(ctx)
	if err != nil {
		k.log.Warn("fetch the OIDC issuer's signing keys", "url", k.url, "err", err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.gen++
	k.tried = k.now()
	k.lastErr = err
	if err != nil {
		return nil, err
	}
	k.keys, k.fetched = keys, k.tried
	return keys, nil
}

// get downloads and parses the key set, keeping the public signing keys.
func (k *keySet) get(ctx context.Context) ([]jose.JSONWebKey, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.url, nil)
	if err != nil {
		return nil, &keysUnavailableError{err: err}
	}
	req.Header.Set("Accept", "application/json")
	resp, err := k.client.Do(req)
	if err != nil {
		return nil, &keysUnavailableError{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes))
	if err != nil {
		return nil, &keysUnavailableError{err: fmt.Errorf("read %s: %w", k.url, err)}
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &keysUnavailableError{err: fmt.Errorf("GET %s: %s", k.url, resp.Status)}
	}
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(body, &set); err != nil {
		return nil, &keysUnavailableError{err: fmt.Errorf("decode %s: %w", k.url, err)}
	}
	keys := make([]jose.JSONWebKey, 0, len(set.Keys))
	for _, raw := range set.Keys {
		var key jose.JSONWebKey
		if err := json.Unmarshal(raw, &key); err != nil {
			continue // a key type go-jose does not know: not one of ours
		}
		if key.Use != "" && key.Use != "sig" {
			continue
		}
		switch key.Key.(type) {
		case *rsa.PublicKey, *ecdsa.PublicKey, ed25519.PublicKey:
			keys = append(keys, key)
		}
	}
	return keys, nil
}
