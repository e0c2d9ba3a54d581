package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/gateway/client/clienttest"
)

func TestAudit(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{Tenant: "acme", Admins: []string{"root"}, AuditPageLimit: 7})
	now := time.Now().UTC()
	for i := range 30 {
		srv.AddAudit(clienttest.AuditEntry{Time: now.Add(time.Duration(i-30) * time.Hour), Tenant: "acme",
			Actor: fmt.Sprintf("user%d", i%3), Via: "oidc", Action: "login", Outcome: "ok", Remote: "10.0.0.1",
			Detail: fmt.Sprintf("n%d", i)})
	}
	srv.AddAudit(clienttest.AuditEntry{Time: now.Add(-time.Minute), Tenant: "acme", Action: "auth_failed",
		Outcome: "failed", Remote: "10.0.0.9", Detail: "token expired"})
	srv.AddAudit(clienttest.AuditEntry{Time: now, Tenant: "other", Actor: "eve", Action: "login", Outcome: "ok"})
	root := newCLI(t, srv.URL)
	root.env["USER"] = "root"

	// The default limit pages through several server pages (7 each).
	var all []client.AuditEntry
	if err := json.Unmarshal([]byte(root.ok("audit", "--json", "--action", "login")), &all); err != nil || len(all) != 30 {
		t.Fatalf("audit --json = %d entries, %v", len(all), err)
	}
	for i, e := range all {
		if e.Detail != fmt.Sprintf("n%d", 29-i) {
			t.Fatalf("entry %d is %s: not newest first", i, e.Detail)
		}
	}

	out, errs, err := root.run(cliContext(t), nil, "audit", "--limit", "10")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 11 || !strings.HasPrefix(lines[0], "TIME") || !strings.Contains(lines[0], "REMOTE") ||
		!strings.Contains(lines[1], "(anonymous)") || !strings.Contains(lines[1], "auth_failed") || !strings.Contains(lines[1], "token expired") ||
		!strings.Contains(lines[2], "user2 (oidc)") || !strings.Contains(lines[2], "10.0.0.1") || !strings.Contains(lines[2], "n29") {
		t.Fatalf("audit --limit 10:\n%s", out)
	}
	if !strings.Contains(errs, "newest 10 shown") {
		t.Fatalf("audit --limit 10 did not say more exist: %q", errs)
	}

	var filtered []client.AuditEntry
	if err := json.Unmarshal([]byte(root.ok("audit", "--json", "--actor", "user1", "--since", "12h", "--until", "3h")), &filtered); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range filtered {
		got = append(got, e.Detail)
	}
	// Entries n18..n26 are 12h..4h old; user1 has i%3==1.
	if strings.Join(got, ",") != "n25,n22,n19" {
		t.Fatalf("filtered audit = %v", got)
	}

	if _, errs, err := root.run(cliContext(t), nil, "audit", "--actor", "nobody"); err != nil || !strings.Contains(errs, "No audit entries match") {
		t.Fatalf("audit with no match = %v, %q", err, errs)
	}

	_, _, err = newCLI(t, srv.URL).run(cliContext(t), nil, "audit")
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "only tenant admins may read the audit log") || !strings.Contains(err.Error(), "atrium whoami") {
		t.Fatalf("audit by a non-admin = %v", err)
	}
	// That refusal is itself on record.
	if log := srv.AuditLog(); log[len(log)-1].Action != "denied" || log[len(log)-1].Actor != "alice" {
		t.Fatalf("last audit entry = %+v", log[len(log)-1])
	}
}

func TestAudit_Errors(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		msg  string
	}{
		"bad since":   {[]string{"audit", "--since", "yesterday"}, "--since"},
		"bad limit":   {[]string{"audit", "--limit", "0"}, "--limit must be at least 1"},
		"inverted":    {[]string{"audit", "--since", "1h", "--until", "2h"}, "--since must be before --until"},
		"bad session": {[]string{"audit", "--session", "a/b"}, "--session"},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := newCLI(t, "http://127.0.0.1:1").run(cliContext(t), nil, tc.args...)
			if exitCode(err) != 2 || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("exit %d, err %v; want 2 and %q", exitCode(err), err, tc.msg)
			}
		})
	}
}
