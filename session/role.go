package session

import "time"

// Role is a user's role on a session. Each role can do what the roles below
// it can: a viewer reads; a driver also prompts, cancels and approves; an owner
// also manages members and deletes.
type Role string

// Roles. RoleNone means no access.
const (
	RoleNone   Role = ""
	RoleViewer Role = "viewer"
	RoleDriver Role = "driver"
	RoleOwner  Role = "owner"
)

func (r Role) rank() int {
	switch r {
	case RoleViewer:
		return 1
	case RoleDriver:
		return 2
	case RoleOwner:
		return 3
	}
	return 0
}

// AtLeast reports whether r grants everything min grants.
func (r Role) AtLeast(min Role) bool { return r.rank() >= min.rank() && r.rank() > 0 }

// Valid reports whether r is one of the three roles.
func (r Role) Valid() bool { return r.rank() > 0 }

// ParseRole parses a role name; "none" and "" mean RoleNone (remove member).
func ParseRole(s string) (Role, error) {
	switch s {
	case "viewer", "driver", "owner":
		return Role(s), nil
	case "", "none":
		return RoleNone, nil
	}
	return RoleNone, Errorf(CodeBadRequest, "unknown role %q: want viewer, driver, owner or none", s)
}

// Principal is an authenticated caller. Gateways set it; nodes trust it only
// from NATS headers, which only gateways write.
type Principal struct {
	User   string `json:"user"`
	Tenant string `json:"tenant,omitempty"`
	// Admin marks a tenant admin: owner of every session of its tenant,
	// and a reader of the tenant's audit log.
	Admin bool `json:"admin,omitempty"`
	// Operator marks someone who runs the installation: they may read the
	// state of the whole cluster (GET /v1/cluster), every tenant's included.
	// Gateways only; never sent to nodes.
	Operator bool `json:"operator,omitempty"`
	// Cap is the most this credential may do on any session, whatever the
	// user's role there: API tokens carry one. RoleNone means no cap.
	Cap Role `json:"cap,omitempty"`
	// Via says how the caller authenticated: one of the Via* constants.
	Via string `json:"via,omitempty"`
	// Expires is when the credential stops working; zero if it does not
	// or is not known. Never sent to nodes.
	Expires time.Time `json:"expires_at,omitzero"`
}

// How a Principal authenticated (Principal.Via).
const (
	ViaCookie = "cookie" // the browser login cookie
	ViaOIDC   = "oidc"   // a bearer ID or access token of the OIDC issuer
	ViaToken  = "token"  // an Atrium API token
	ViaDev    = "dev"    // the dev identity of `atrium dev`
)

// Limit returns r lowered to p's cap: the role p acts with where its user
// has r. A cap that is not a role grants nothing.
func (p Principal) Limit(r Role) Role {
	switch {
	case p.Cap == RoleNone:
		return r
	case !p.Cap.Valid():
		return RoleNone
	case r.rank() > p.Cap.rank():
		return p.Cap
	}
	return r
}

// RoleFor is the one decision of what p may do on a session of tenant,
// owned by owner, with members m; gateways and nodes both use it. A session
// of another tenant gives no role (it does not exist for p). Its owner and
// the tenant's admins are owners; anyone else has their member role. The
// result is then lowered to p's cap.
func RoleFor(p Principal, tenant, owner string, m Members) Role {
	if p.Tenant != tenant || p.User == "" {
		return RoleNone
	}
	r := m.RoleOf(p.User)
	if p.User == owner || p.Admin {
		r = RoleOwner
	}
	return p.Limit(r)
}

// Members maps user names to roles.
type Members map[string]Role

// RoleOf returns user's role: the owner is always RoleOwner.
func (m Members) RoleOf(user string) Role { return m[user] }

// Action is something a caller does to a session.
type Action int

// Actions and the role each needs.
const (
	ActRead   Action = iota // info, history, watch
	ActDrive                // prompt, cancel, approve
	ActManage               // members, delete
)

// Need returns the least role that may perform a.
func (a Action) Need() Role {
	switch a {
	case ActDrive:
		return RoleDriver
	case ActManage:
		return RoleOwner
	}
	return RoleViewer
}

// Authorize returns nil if role may perform a, ErrNotFound if role is none
// (a session you may not see does not exist for you), or a forbidden error.
func Authorize(role Role, a Action) error {
	if !role.Valid() {
		return Errorf(CodeNotFound, "session not found")
	}
	if !role.AtLeast(a.Need()) {
		return Errorf(CodeForbidden, "this needs the %s role; you are a %s", a.Need(), role)
	}
	return nil
}

// Headers returns the NATS message headers that carry p from a gateway to a
// node: HeaderUser, and HeaderTenant, HeaderAdmin and HeaderCap when set.
func (p Principal) Headers() map[string][]string {
	h := map[string][]string{HeaderUser: {p.User}}
	if p.Tenant != "" {
		h[HeaderTenant] = []string{p.Tenant}
	}
	if p.Admin {
		h[HeaderAdmin] = []string{"1"}
	}
	if p.Cap != RoleNone {
		h[HeaderCap] = []string{string(p.Cap)}
	}
	return h
}

// PrincipalFrom reads the principal that Headers wrote; get returns a
// header's value, "" when absent. A cap that is not a role is kept as it
// is, so that it grants nothing (see Limit).
func PrincipalFrom(get func(key string) string) Principal {
	return Principal{
		User:   get(HeaderUser),
		Tenant: get(HeaderTenant),
		Admin:  get(HeaderAdmin) == "1",
		Cap:    Role(get(HeaderCap)),
	}
}
