package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/gateway/client/clienttest"
	"github.com/atriumhq/atrium/session"
)

func TestToken_CreateListRevoke(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{Tenant: "acme", Admins: []string{"root"}})
	c := newCLI(t, srv.URL)

	out, errs, err := c.run(cliContext(t), nil, "token", "create", "--name", "ci", "--expires", "30d", "--role", "driver")
	if err != nil {
		t.Fatalf("token create: %v\n%s", err, errs)
	}
	tok := strings.TrimSpace(out)
	if !strings.HasPrefix(tok, "atr_") || strings.Count(out, "\n") != 1 {
		t.Fatalf("token create printed %q on stdout, want the token alone", out)
	}
	for _, want := range []string{"Created token", `"ci"`, "role capped at driver", "expires", "only time it is shown"} {
		if !strings.Contains(errs, want) {
			t.Errorf("token create stderr does not say %q:\n%s", want, errs)
		}
	}
	if strings.Contains(errs, tok) {
		t.Error("the token was printed twice")
	}

	// The token works as --token and ATRIUM_TOKEN.
	bot := newCLI(t, srv.URL)
	bot.env["ATRIUM_TOKEN"] = tok
	if who := bot.ok("whoami"); !strings.Contains(who, "alice") || !strings.Contains(who, "token") {
		t.Fatalf("whoami with the token:\n%s", who)
	}

	var created client.NewToken
	if err := json.Unmarshal([]byte(c.ok("token", "create", "--name", "viewer bot", "--role", "viewer", "--json")), &created); err != nil ||
		created.Info.Role != session.RoleViewer || !strings.HasPrefix(created.Token, "atr_"+created.Info.ID) || !created.Info.ExpiresAt.IsZero() {
		t.Fatalf("token create --json = %+v, %v", created, err)
	}

	table := c.ok("token", "ls")
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[0], "LAST USED") ||
		!strings.Contains(lines[1], "ci") || !strings.Contains(lines[1], "driver") || !strings.Contains(lines[1], "ago") ||
		!strings.Contains(lines[2], "viewer bot") || !strings.Contains(lines[2], "never") {
		t.Fatalf("token ls:\n%s", table)
	}
	var list []client.TokenInfo
	if err := json.Unmarshal([]byte(c.ok("token", "ls", "--json")), &list); err != nil || len(list) != 2 {
		t.Fatalf("token ls --json = %+v, %v", list, err)
	}

	_, _, err = c.run(cliContext(t), nil, "token", "ls", "--all")
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "only tenant admins") {
		t.Fatalf("token ls --all by a non-admin = %v", err)
	}
	root := newCLI(t, srv.URL)
	root.env["USER"] = "root"
	if all := root.ok("token", "ls", "--all"); !strings.Contains(all, "USER") || strings.Count(all, "alice") != 2 {
		t.Fatalf("token ls --all by an admin:\n%s", all)
	}

	// Revoke by id, or by pasting the whole token (its secret is not echoed).
	if out := c.ok("token", "revoke", list[0].ID); !strings.Contains(out, "Revoked token "+list[0].ID) {
		t.Fatalf("token revoke printed %q", out)
	}
	_, _, err = bot.run(cliContext(t), nil, "whoami")
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("whoami with a revoked token = %v", err)
	}
	if out := c.ok("token", "revoke", created.Token); !strings.Contains(out, created.Info.ID) || strings.Contains(out, created.Token) {
		t.Fatalf("token revoke of a pasted token printed %q", out)
	}
	_, _, err = c.run(cliContext(t), nil, "token", "revoke", list[0].ID)
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "no token "+list[0].ID) || !strings.Contains(err.Error(), "atrium token ls") {
		t.Fatalf("revoking twice = %v", err)
	}
	if _, errs, err := c.run(cliContext(t), nil, "token", "ls"); err != nil || !strings.Contains(errs, "No API tokens") {
		t.Fatalf("token ls with none = %v, %q", err, errs)
	}
	if out := c.ok("token", "ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("token ls --json with none = %q", out)
	}
}

func TestToken_Errors(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	for name, tc := range map[string]struct {
		args []string
		code int
		msg  string
	}{
		"no name":       {[]string{"token", "create"}, 2, "--name is required"},
		"bad expires":   {[]string{"token", "create", "--name", "x", "--expires", "soon"}, 2, "not a duration"},
		"past expires":  {[]string{"token", "create", "--name", "x", "--expires", "2001-01-01"}, 2, "in the past"},
		"bad role":      {[]string{"token", "create", "--name", "x", "--role", "none"}, 2, "want viewer, driver or owner"},
		"revoke no id":  {[]string{"token", "revoke"}, 2, "revoke takes 1 argument(s): ID"},
		"unknown flag":  {[]string{"token", "ls", "--bogus"}, 2, "unknown flag: --bogus"},
		"unknown sub":   {[]string{"token", "rotate"}, 2, `unknown command "rotate": want create, ls or revoke`},
		"capped create": {[]string{"token", "create", "--name", "x", "--token", "dev:"}, 1, "invalid dev user"},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := newCLI(t, srv.URL).run(cliContext(t), nil, tc.args...)
			if exitCode(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("exit %d, err %v; want %d and %q", exitCode(err), err, tc.code, tc.msg)
			}
		})
	}
	// "atrium token" alone shows its help.
	if out := newCLI(t, srv.URL).ok("token"); !strings.Contains(out, "token create --name ci") {
		t.Fatalf("atrium token printed:\n%s", out)
	}
}

func TestToken_ParseTime(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"30d":                  now.Add(30 * 24 * time.Hour),
		"720h":                 now.Add(720 * time.Hour),
		"90m":                  now.Add(90 * time.Minute),
		"2027-01-01T00:00:00Z": time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC),
		"2027-01-01":           time.Date(2027, 1, 1, 0, 0, 0, 0, time.Local),
	} {
		got, err := parseExpires(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("parseExpires(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0s", "-5h", "0d", "tomorrow", "2026-02-01"} {
		if _, err := parseExpires(in, now); err == nil {
			t.Errorf("parseExpires(%q): no error", in)
		}
	}
	if got, _ := parseTime("7d", now, -1); !got.Equal(now.Add(-7 * 24 * time.Hour)) {
		t.Errorf("parseTime(7d, ago) = %v", got)
	}
	for d, want := range map[time.Duration]string{
		30 * time.Second: "30s", 12 * time.Minute: "12m", 3*time.Hour + 5*time.Minute: "3h5m", 2 * time.Hour: "2h",
		100 * time.Hour: "4d",
	} {
		if got := humanDuration(d); got != want {
			t.Errorf("humanDuration(%v) = %q, want %q", d, got, want)
		}
	}
}
