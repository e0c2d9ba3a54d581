package clienttest

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/atriumhq/atrium/session"
)

// AuthConfig is the body of GET /auth/config.
type AuthConfig struct {
	Mode         string   `json:"mode"`
	Issuer       string   `json:"issuer,omitempty"`
	ClientID     string   `json:"client_id,omitempty"`
	ClientSecret string   `json:"client_secret,omitempty"`
	Scopes       []string `json:"scopes,omitempty"`
	LoginURL     string   `json:"login_url,omitempty"`
}

// Identity is an authenticated caller.
type Identity struct {
	User   string
	Tenant string
	// Admin makes the caller a tenant admin: owner of every session of
	// its tenant, reader of the audit log.
	Admin bool
	// Via is "dev", "token", "oidc", …
	Via string
	// ExpiresAt is when the credential expires; zero if never.
	ExpiresAt time.Time
	// Cap is the most an API token may do; RoleNone is no cap.
	Cap session.Role
}

// AuditEntry is one entry of the fake's audit log, in the contract's shape.
type AuditEntry struct {
	ID      string    `json:"id"`
	Time    time.Time `json:"time"`
	Tenant  string    `json:"tenant"`
	Actor   string    `json:"actor"`
	Via     string    `json:"via,omitempty"`
	Action  string    `json:"action"`
	Session string    `json:"session,omitempty"`
	Target  string    `json:"target,omitempty"`
	Outcome string    `json:"outcome"`
	Detail  string    `json:"detail,omitempty"`
	Remote  string    `json:"remote"`
}

// tokenInfo is TokenInfo of the contract.
type tokenInfo struct {
	ID         string       `json:"id"`
	Name       string       `json:"name"`
	User       string       `json:"user"`
	Tenant     string       `json:"tenant,omitempty"`
	Role       session.Role `json:"role,omitempty"`
	CreatedAt  time.Time    `json:"created_at"`
	ExpiresAt  time.Time    `json:"expires_at,omitzero"`
	LastUsedAt time.Time    `json:"last_used_at,omitzero"`
}

// ftoken is an API token; like the real server, only its secret's hash
// is kept.
type ftoken struct {
	info  tokenInfo
	admin bool
	hash  [32]byte
}

// AddAudit appends entries to the audit log as if the server had recorded
// them; an entry without ID or Time gets one.
func (s *Server) AddAudit(entries ...AuditEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range entries {
		s.addAuditLocked(e)
	}
}

// AuditLog returns the audit log, oldest first.
func (s *Server) AuditLog() []AuditEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.auditLog)
}

// Tokens returns the API tokens that exist (not revoked), oldest first.
func (s *Server) Tokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for id := range s.tokens {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		return s.tokens[ids[i]].info.CreatedAt.Before(s.tokens[ids[j]].info.CreatedAt)
	})
	return ids
}

func (s *Server) addAuditLocked(e AuditEntry) {
	if e.ID == "" {
		e.ID = "a" + strconv.Itoa(len(s.auditLog)+1)
	}
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	s.auditLog = append(s.auditLog, e)
}

// recordLocked audits what who did in request r.
func (s *Server) recordLocked(r *http.Request, who Identity, e AuditEntry) {
	e.Tenant, e.Actor, e.Via = who.Tenant, who.User, who.Via
	e.Remote = remoteOf(r)
	s.addAuditLocked(e)
}

func remoteOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// roleOf is the contract's RoleFor: another tenant's session does not
// exist; an admin owns its tenant's sessions; a token's cap bounds it.
func roleOf(ss *fsession, who Identity) session.Role {
	if ss.meta.Tenant != who.Tenant {
		return session.RoleNone
	}
	r := ss.meta.Members.RoleOf(who.User)
	if who.Admin {
		r = session.RoleOwner
	}
	if who.Cap.Valid() && r.Valid() && !who.Cap.AtLeast(r) {
		r = who.Cap
	}
	return r
}

// authError is a failed authentication: 401 with a WWW-Authenticate header.
type authError struct{ msg string }

func (e authError) Error() string { return e.msg }

func writeAuthError(w http.ResponseWriter, err error) {
	w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="atrium", error="invalid_token", error_description=%q`, err.Error()))
	writeError(w, session.Errorf(session.CodeUnauthenticated, "%s", err.Error()))
}

// identify authenticates r's bearer token.
func (s *Server) identify(r *http.Request) (Identity, error) {
	h := r.Header.Get("Authorization")
	s.mu.Lock()
	s.auths = append(s.auths, h)
	s.mu.Unlock()
	who, err := s.identifyToken(r, h)
	if err != nil {
		s.mu.Lock()
		s.recordLocked(r, Identity{}, AuditEntry{Action: "auth_failed", Outcome: "failed", Detail: err.Error()})
		s.mu.Unlock()
	}
	return who, err
}

func (s *Server) identifyToken(r *http.Request, h string) (Identity, error) {
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || tok == "" {
		return Identity{}, authError{"send Authorization: Bearer <token>"}
	}
	if user, ok := strings.CutPrefix(tok, "dev:"); ok {
		if session.ValidUser(user) != nil {
			return Identity{}, authError{"invalid dev user"}
		}
		return Identity{User: user, Tenant: s.opts.Tenant, Admin: slices.Contains(s.opts.Admins, user), Via: "dev"}, nil
	}
	if rest, ok := strings.CutPrefix(tok, "atr_"); ok {
		id, secret, _ := strings.Cut(rest, "_")
		s.mu.Lock()
		defer s.mu.Unlock()
		t := s.tokens[id]
		sum := sha256.Sum256([]byte(secret))
		if t == nil || subtle.ConstantTimeCompare(sum[:], t.hash[:]) != 1 {
			return Identity{}, authError{"unknown or revoked API token"}
		}
		now := time.Now().UTC()
		if !t.info.ExpiresAt.IsZero() && now.After(t.info.ExpiresAt) {
			return Identity{}, authError{"the API token expired at " + t.info.ExpiresAt.Format(time.RFC3339)}
		}
		t.info.LastUsedAt = now
		return Identity{User: t.info.User, Tenant: t.info.Tenant, Admin: t.admin, Via: "token",
			ExpiresAt: t.info.ExpiresAt, Cap: t.info.Role}, nil
	}
	if s.opts.Authenticate == nil {
		return Identity{}, authError{"invalid token"}
	}
	who, err := s.opts.Authenticate(r.Context(), tok)
	if err != nil {
		return Identity{}, authError{err.Error()}
	}
	return who, nil
}

func (s *Server) authConfig(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.opts.Auth)
}

func (s *Server) whoami(w http.ResponseWriter, _ *http.Request, who Identity) error {
	writeJSON(w, http.StatusOK, struct {
		User      string    `json:"user"`
		Tenant    string    `json:"tenant"`
		Admin     bool      `json:"admin"`
		Via       string    `json:"via"`
		ExpiresAt time.Time `json:"expires_at,omitzero"`
	}{who.User, who.Tenant, who.Admin, who.Via, who.ExpiresAt})
	return nil
}

func (s *Server) createToken(w http.ResponseWriter, r *http.Request, who Identity) error {
	var body struct {
		Name      string `json:"name"`
		ExpiresAt string `json:"expires_at"`
		Role      string `json:"role"`
	}
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	if body.Name == "" || len(body.Name) > 100 {
		return session.Errorf(session.CodeBadRequest, "name must be 1 to 100 bytes")
	}
	var expires time.Time
	if body.ExpiresAt != "" {
		t, err := time.Parse(time.RFC3339, body.ExpiresAt)
		if err != nil {
			return session.Errorf(session.CodeBadRequest, "expires_at must be an RFC 3339 time")
		}
		if !t.After(time.Now()) {
			return session.Errorf(session.CodeBadRequest, "expires_at is in the past")
		}
		expires = t.UTC()
	}
	role, err := session.ParseRole(body.Role)
	if err != nil || body.Role == "none" {
		return session.Errorf(session.CodeBadRequest, "role must be viewer, driver or owner")
	}
	if who.Cap.Valid() && (!role.Valid() || !who.Cap.AtLeast(role)) {
		// A token never creates a token with more rights than its own.
		role = who.Cap
	}
	idb, secretb := make([]byte, 6), make([]byte, 24)
	_, _ = rand.Read(idb)
	_, _ = rand.Read(secretb)
	id, secret := hex.EncodeToString(idb), base64.RawURLEncoding.EncodeToString(secretb)
	secret = strings.ReplaceAll(secret, "_", "-") // "_" separates the token's parts
	t := &ftoken{
		info: tokenInfo{ID: id, Name: body.Name, User: who.User, Tenant: who.Tenant, Role: role,
			CreatedAt: time.Now().UTC(), ExpiresAt: expires},
		admin: who.Admin,
		hash:  sha256.Sum256([]byte(secret)),
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens[id] = t
	s.recordLocked(r, who, AuditEntry{Action: "token_created", Target: id, Outcome: "ok", Detail: body.Name})
	writeJSON(w, http.StatusCreated, struct {
		Token string    `json:"token"`
		Info  tokenInfo `json:"info"`
	}{"atr_" + id + "_" + secret, t.info})
	return nil
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request, who Identity) error {
	all := r.URL.Query().Get("all")
	if all != "" && all != "0" && !who.Admin {
		s.mu.Lock()
		s.recordLocked(r, who, AuditEntry{Action: "denied", Outcome: "denied", Detail: "list all tokens"})
		s.mu.Unlock()
		return session.Errorf(session.CodeForbidden, "only tenant admins may list every token of the tenant")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []tokenInfo{}
	for _, t := range s.tokens {
		if t.info.Tenant == who.Tenant && (t.info.User == who.User || (all != "" && all != "0")) {
			out = append(out, t.info)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	writeJSON(w, http.StatusOK, map[string]any{"tokens": out})
	return nil
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request, who Identity) error {
	id := r.PathValue("id")
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tokens[id]
	if t == nil || t.info.Tenant != who.Tenant || (t.info.User != who.User && !who.Admin) {
		return session.Errorf(session.CodeNotFound, "no token %q", id)
	}
	delete(s.tokens, id)
	s.recordLocked(r, who, AuditEntry{Action: "token_revoked", Target: id, Outcome: "ok"})
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) audit(w http.ResponseWriter, r *http.Request, who Identity) error {
	if !who.Admin {
		s.mu.Lock()
		s.recordLocked(r, who, AuditEntry{Action: "denied", Outcome: "denied", Detail: "read the audit log"})
		s.mu.Unlock()
		return session.Errorf(session.CodeForbidden, "only tenant admins may read the audit log")
	}
	q := r.URL.Query()
	var since, until time.Time
	for _, p := range []struct {
		name string
		t    *time.Time
	}{{"since", &since}, {"until", &until}} {
		if v := q.Get(p.name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return session.Errorf(session.CodeBadRequest, "%s must be an RFC 3339 time", p.name)
			}
			*p.t = t
		}
	}
	limit := s.opts.AuditPageLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return session.Errorf(session.CodeBadRequest, "limit must be a positive number")
		}
		limit = min(n, limit)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// The cursor is the index of the next (older) entry to consider.
	start := len(s.auditLog) - 1
	if c := q.Get("cursor"); c != "" {
		b, err := base64.RawURLEncoding.DecodeString(c)
		n, err2 := strconv.Atoi(string(b))
		if err != nil || err2 != nil || n < 0 || n >= len(s.auditLog) {
			return session.Errorf(session.CodeBadRequest, "bad cursor")
		}
		start = n
	}
	page := struct {
		Entries []AuditEntry `json:"entries"`
		Next    string       `json:"next"`
	}{Entries: []AuditEntry{}}
	i := start
	for ; i >= 0 && len(page.Entries) < limit; i-- {
		e := s.auditLog[i]
		if e.Tenant != who.Tenant ||
			(q.Get("actor") != "" && e.Actor != q.Get("actor")) ||
			(q.Get("action") != "" && e.Action != q.Get("action")) ||
			(q.Get("session") != "" && e.Session != q.Get("session")) ||
			(!since.IsZero() && e.Time.Before(since)) ||
			(!until.IsZero() && !e.Time.Before(until)) {
			continue
		}
		page.Entries = append(page.Entries, e)
	}
	if i >= 0 {
		page.Next = base64.RawURLEncoding.EncodeToString([]byte(strconv.Itoa(i)))
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}
