package session

import (
	"net/http"
	"testing"
)

func TestRoleFor(t *testing.T) {
	members := Members{"olive": RoleOwner, "dan": RoleDriver, "vic": RoleViewer}
	for name, tc := range map[string]struct {
		p    Principal
		want Role
	}{
		"owner":                       {Principal{User: "olive", Tenant: "acme"}, RoleOwner},
		"driver":                      {Principal{User: "dan", Tenant: "acme"}, RoleDriver},
		"viewer":                      {Principal{User: "vic", Tenant: "acme"}, RoleViewer},
		"no role":                     {Principal{User: "nina", Tenant: "acme"}, RoleNone},
		"other tenant":                {Principal{User: "dan", Tenant: "globex"}, RoleNone},
		"no tenant":                   {Principal{User: "dan"}, RoleNone},
		"other tenant's owner name":   {Principal{User: "olive", Tenant: "globex"}, RoleNone},
		"admin":                       {Principal{User: "ada", Tenant: "acme", Admin: true}, RoleOwner},
		"admin and viewer":            {Principal{User: "vic", Tenant: "acme", Admin: true}, RoleOwner},
		"admin of other tenant":       {Principal{User: "ada", Tenant: "globex", Admin: true}, RoleNone},
		"driver capped at viewer":     {Principal{User: "dan", Tenant: "acme", Cap: RoleViewer}, RoleViewer},
		"viewer capped at driver":     {Principal{User: "vic", Tenant: "acme", Cap: RoleDriver}, RoleViewer},
		"owner capped at driver":      {Principal{User: "olive", Tenant: "acme", Cap: RoleDriver}, RoleDriver},
		"admin capped at viewer":      {Principal{User: "ada", Tenant: "acme", Admin: true, Cap: RoleViewer}, RoleViewer},
		"no role capped":              {Principal{User: "nina", Tenant: "acme", Cap: RoleOwner}, RoleNone},
		"unknown cap grants nothing":  {Principal{User: "olive", Tenant: "acme", Cap: "root"}, RoleNone},
		"owner by name, not a member": {Principal{User: "olga", Tenant: "acme"}, RoleOwner},
		"empty user":                  {Principal{Tenant: "acme", Admin: true}, RoleNone},
	} {
		t.Run(name, func(t *testing.T) {
			owner := "olive"
			if tc.p.User == "olga" {
				owner = "olga"
			}
			if got := RoleFor(tc.p, "acme", owner, members); got != tc.want {
				t.Fatalf("RoleFor = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestPrincipal_Headers(t *testing.T) {
	for name, p := range map[string]Principal{
		"plain":   {User: "alice"},
		"tenant":  {User: "alice", Tenant: "acme"},
		"admin":   {User: "alice", Tenant: "acme", Admin: true},
		"capped":  {User: "alice", Tenant: "acme", Cap: RoleViewer},
		"all set": {User: "alice", Tenant: "acme", Admin: true, Cap: RoleDriver},
	} {
		t.Run(name, func(t *testing.T) {
			h := http.Header(p.Headers())
			got := PrincipalFrom(func(k string) string {
				if v := h[k]; len(v) > 0 {
					return v[0]
				}
				return ""
			})
			if got != p {
				t.Fatalf("round trip of %+v gave %+v", p, got)
			}
		})
	}
	if h := (Principal{User: "bob"}).Headers(); len(h) != 1 {
		t.Errorf("a plain principal sends only its user: %v", h)
	}
}
