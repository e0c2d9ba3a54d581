package session

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
