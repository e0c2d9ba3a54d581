package channel

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
)

// Identity maps platform users to Atrium users. A person is known if a row
// of Users names them, or if their workspace maps email domains to a tenant
// and the platform vouches for their email address (Slack does; Telegram
// has no emails, so Telegram users need a row). Anyone else is unknown and
// is told how to get access; they never get a session.
type Identity struct {
	// Workspaces maps platform installations to tenants.
	Workspaces []WorkspaceMapping
	// Users maps individual platform users to Atrium users.
	Users []UserMapping
}

// WorkspaceMapping makes the people of one platform installation members
// of a tenant.
type WorkspaceMapping struct {
	// Platform and Workspace name the installation (a Slack team id such as
	// T0123ABCD; a Telegram bot id, the digits before the colon of its token).
	Platform  string
	Workspace string
	// Tenant is the Atrium tenant of its people.
	Tenant string
	// EmailDomains, if set, lets people of the workspace whose verified
	// email is in one of these domains in as the Atrium user named by
	// their email address (lower case): the name OIDC logins give them
	// with the default user_claim, so that they are the same user in the
	// web UI and in chat.
	EmailDomains []string
}

// UserMapping names the Atrium user of one platform user.
type UserMapping struct {
	Platform string
	// Workspace, if set, limits the row to one installation.
	Workspace string
	// ID is the platform's user id (Slack: U0123ABCD; Telegram: digits).
	ID string
	// User is the Atrium user name.
	User string
	// Tenant is the user's tenant; default the tenant of the workspace
	// the user writes from (a row without Tenant does not match in a
	// workspace that has no workspaces row).
	Tenant string
}

// Validate checks the mapping and says which row is wrong.
func (id Identity) Validate() error {
	for i, w := range id.Workspaces {
		if w.Platform == "" || w.Workspace == "" || w.Tenant == "" {
			return fmt.Errorf("channel identity: workspaces[%d] needs platform, workspace and tenant", i)
		}
		for _, d := range w.EmailDomains {
			if d == "" || strings.ContainsAny(d, "@ ") {
				return fmt.Errorf("channel identity: workspaces[%d]: email domain %q should look like example.com", i, d)
			}
		}
	}
	for i, u := range id.Users {
		if u.Platform == "" || u.ID == "" || u.User == "" {
			return fmt.Errorf("channel identity: users[%d] needs platform, id and user", i)
		}
		if err := session.ValidUser(u.User); err != nil {
			return fmt.Errorf("channel identity: users[%d]: %w", i, err)
		}
		if u.Tenant == "" && !id.hasWorkspace(u.Platform, u.Workspace) {
			return fmt.Errorf("channel identity: users[%d] (%s %s) needs a tenant, or a workspaces row for its workspace", i, u.Platform, u.ID)
		}
	}
	return nil
}

// hasWorkspace reports whether a workspaces row gives a tenant to users of
// platform in ws (in any workspace of platform, if ws is "").
func (id Identity) hasWorkspace(platform, ws string) bool {
	for _, w := range id.Workspaces {
		if w.Platform == platform && (ws == "" || w.Workspace == ws) {
			return true
		}
	}
	return false
}

func (id Identity) workspace(platform, ws string) *WorkspaceMapping {
	for i := range id.Workspaces {
		w := &id.Workspaces[i]
		if w.Platform == platform && w.Workspace == ws {
			return w
		}
	}
	return nil
}

// How long the directory trusts what it found out about a user.
const (
	knownTTL   = 5 * time.Minute
	unknownTTL = time.Minute
	dirMax     = 10000
)

// directory resolves platform users to principals, with a cache.
type directory struct {
	id  Identity
	now func() time.Time

	mu    sync.Mutex
	cache map[string]resolved // guarded by mu
}

type resolved struct {
	p       session.Principal
	ok      bool
	expires time.Time
}

// resolve returns the principal of u in th's workspace, and false if u is
// unknown. An error means the platform could not be asked (worth retrying).
func (d *directory) resolve(ctx context.Context, ch Channel, th Thread, u User) (session.Principal, bool, error) {
	key := th.Platform + "\x00" + th.Workspace + "\x00" + u.ID
	now := d.now()
	d.mu.Lock()
	if r, ok := d.cache[key]; ok && now.Before(r.expires) {
		d.mu.Unlock()
		return r.p, r.ok, nil
	}
	d.mu.Unlock()

	p, ok, err := d.lookup(ctx, ch, th, u)
	if err != nil {
		return session.Principal{}, false, err
	}
	ttl := knownTTL
	if !ok {
		ttl = unknownTTL
	}
	d.mu.Lock()
	if d.cache == nil || len(d.cache) >= dirMax {
		d.cache = make(map[string]resolved)
	}
	d.cache[key] = resolved{p: p, ok: ok, expires: now.Add(ttl)}
	d.mu.Unlock()
	return p, ok, nil
}

func (d *directory) lookup(ctx context.Context, ch Channel, th Thread, u User) (session.Principal, bool, error) {
	ws := d.id.workspace(th.Platform, th.Workspace)
	for _, m := range d.id.Users {
		if m.Platform != th.Platform || m.ID != u.ID || (m.Workspace != "" && m.Workspace != th.Workspace) {
			continue
		}
		tenant := m.Tenant
		if tenant == "" && ws != nil {
			tenant = ws.Tenant
		}
		if tenant == "" {
			continue
		}
		return principal(th.Platform, m.User, tenant), true, nil
	}
	if ws == nil || len(ws.EmailDomains) == 0 {
		return session.Principal{}, false, nil
	}
	em, ok := ch.(Emails)
	if !ok {
		return session.Principal{}, false, nil
	}
	email, err := em.VerifiedEmail(ctx, th.Workspace, u.ID)
	if err != nil {
		return session.Principal{}, false, fmt.Errorf("look up email of %s user %s: %w", th.Platform, u.ID, err)
	}
	email = strings.ToLower(strings.TrimSpace(email))
	at := strings.LastIndexByte(email, '@')
	if at <= 0 || session.ValidUser(email) != nil {
		return session.Principal{}, false, nil
	}
	domain := email[at+1:]
	for _, d := range ws.EmailDomains {
		if strings.EqualFold(d, domain) {
			return principal(th.Platform, email, ws.Tenant), true, nil
		}
	}
	return session.Principal{}, false, nil
}

// principal is a chat user acting through a platform: never an admin, with
// the user's own roles.
func principal(platform, user, tenant string) session.Principal {
	return session.Principal{User: user, Tenant: tenant, Via: platform}
}
