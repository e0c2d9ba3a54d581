package actor

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/session"
)

// requestAs sends a request with every principal header a gateway sets.
func (e *env) requestAs(subject string, p session.Principal, body any) (session.Reply, error) {
	var rep session.Reply
	b, err := json.Marshal(body)
	if err != nil {
		return rep, err
	}
	msg := &nats.Msg{Subject: subject, Data: b, Header: nats.Header(p.Headers())}
	resp, err := e.gw.RequestMsg(msg, 20*time.Second)
	if err != nil {
		return rep, err
	}
	err = json.Unmarshal(resp.Data, &rep)
	return rep, err
}

// cmdAs sends c to id as p, activating the session when it sleeps, and
// returns the reply's error code ("" for success).
func (e *env) cmdAs(id session.ID, p session.Principal, c session.Command) (session.Reply, session.Code) {
	e.t.Helper()
	for range 10 {
		rep, err := e.requestAs(e.subj.Cmd(id), p, c)
		if errors.Is(err, nats.ErrNoResponders) {
			rep, err = e.requestAs(e.subj.Place(), p, session.PlaceRequest{Op: session.PlaceActivate, Session: id})
			if err != nil {
				e.t.Fatalf("activate %s: %v", id, err)
			}
			continue
		}
		if err != nil {
			e.t.Fatalf("%s on %s: %v", c.Op, id, err)
		}
		if rep.Error != nil {
			return rep, rep.Error.Code
		}
		return rep, ""
	}
	e.t.Fatalf("%s on %s: no responder", c.Op, id)
	return session.Reply{}, ""
}

// TestSession_RoleFromHeaders checks that the node decides roles with
// session.RoleFor from the gateway's headers: tenants are isolated, a tenant
// admin is an owner of every session of its tenant, and a cap lowers a role.
func TestSession_RoleFromHeaders(t *testing.T) {
	e := newEnv(t)
	owner := session.Principal{User: "olive", Tenant: "acme"}
	id := session.NewID()
	rep, err := e.requestAs(e.subj.Place(), owner, session.PlaceRequest{Op: session.PlaceCreate, Session: id, Title: "roles", Harness: shell()})
	if err != nil || rep.Error != nil {
		t.Fatalf("create: %v %v", err, rep.Error)
	}
	if rep.Session == nil || rep.Session.Role != session.RoleOwner {
		t.Fatalf("creator sees %+v", rep.Session)
	}
	if _, code := e.cmdAs(id, owner, session.Command{Op: session.OpMember, User: "dan", Role: session.RoleDriver}); code != "" {
		t.Fatalf("add driver: %s", code)
	}
	entry, ok := e.catalog(id)
	if !ok || entry.Tenant != "acme" {
		t.Fatalf("catalog entry %+v", entry)
	}

	// Cancel with no running turn is a conflict once the role allows it.
	const allowed = session.CodeConflict
	for name, tc := range map[string]struct {
		p                  session.Principal
		role               session.Role // the role info reports
		read, drive, admin session.Code // codes of info, cancel and a member change
	}{
		"owner":                  {owner, session.RoleOwner, "", allowed, ""},
		"driver":                 {session.Principal{User: "dan", Tenant: "acme"}, session.RoleDriver, "", allowed, session.CodeForbidden},
		"no role":                {session.Principal{User: "nina", Tenant: "acme"}, "", session.CodeNotFound, session.CodeNotFound, session.CodeNotFound},
		"other tenant":           {session.Principal{User: "dan", Tenant: "globex"}, "", session.CodeNotFound, session.CodeNotFound, session.CodeNotFound},
		"other tenant, as owner": {session.Principal{User: "olive", Tenant: "globex"}, "", session.CodeNotFound, session.CodeNotFound, session.CodeNotFound},
		"no tenant":              {session.Principal{User: "dan"}, "", session.CodeNotFound, session.CodeNotFound, session.CodeNotFound},
		"tenant admin":           {session.Principal{User: "ada", Tenant: "acme", Admin: true}, session.RoleOwner, "", allowed, ""},
		"other tenant's admin":   {session.Principal{User: "ada", Tenant: "globex", Admin: true}, "", session.CodeNotFound, session.CodeNotFound, session.CodeNotFound},
		"driver capped viewer":   {session.Principal{User: "dan", Tenant: "acme", Cap: session.RoleViewer}, session.RoleViewer, "", session.CodeForbidden, session.CodeForbidden},
		"owner capped driver":    {session.Principal{User: "olive", Tenant: "acme", Cap: session.RoleDriver}, session.RoleDriver, "", allowed, session.CodeForbidden},
		"admin capped viewer":    {session.Principal{User: "ada", Tenant: "acme", Admin: true, Cap: session.RoleViewer}, session.RoleViewer, "", session.CodeForbidden, session.CodeForbidden},
		"unknown cap":            {session.Principal{User: "olive", Tenant: "acme", Cap: "root"}, "", session.CodeNotFound, session.CodeNotFound, session.CodeNotFound},
	} {
		t.Run(name, func(t *testing.T) {
			rep, code := e.cmdAs(id, tc.p, session.Command{Op: session.OpInfo})
			if code != tc.read {
				t.Fatalf("info: code %q, want %q", code, tc.read)
			}
			if code == "" && rep.Session.Role != tc.role {
				t.Errorf("info: role %q, want %q", rep.Session.Role, tc.role)
			}
			if _, code := e.cmdAs(id, tc.p, session.Command{Op: session.OpHistory}); code != tc.read {
				t.Errorf("history: code %q, want %q", code, tc.read)
			}
			if _, code := e.cmdAs(id, tc.p, session.Command{Op: session.OpCancel}); code != tc.drive {
				t.Errorf("cancel: code %q, want %q", code, tc.drive)
			}
			if tc.drive != allowed { // an allowed prompt would start a turn, which cancel above must not find.
				if _, code := e.cmdAs(id, tc.p, session.Command{Op: session.OpPrompt, Text: "echo hi"}); code != tc.drive {
					t.Errorf("prompt: code %q, want %q", code, tc.drive)
				}
			}
			if _, code := e.cmdAs(id, tc.p, session.Command{Op: session.OpMember, User: "vic", Role: session.RoleViewer}); code != tc.admin {
				t.Errorf("member: code %q, want %q", code, tc.admin)
			}
			if tc.admin != "" { // where deleting is allowed, the last step below does it.
				if _, code := e.cmdAs(id, tc.p, session.Command{Op: session.OpDelete}); code != tc.admin {
					t.Errorf("delete: code %q, want %q", code, tc.admin)
				}
			}
		})
	}

	// A tenant admin may delete any session of its tenant.
	if _, code := e.cmdAs(id, session.Principal{User: "ada", Tenant: "acme", Admin: true}, session.Command{Op: session.OpDelete}); code != "" {
		t.Fatalf("admin delete: %s", code)
	}
	eventually(t, "catalog entry removed", func() bool { _, ok := e.catalog(id); return !ok })
}
