package forge_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/gateway/dlq"
	"github.com/atriumhq/atrium/gateway/forge"
	"github.com/atriumhq/atrium/gateway/forge/forgetest"
)

func TestClient(t *testing.T) {
	for _, typ := range []string{forge.TypeGitHub, forge.TypeGitea} {
		t.Run(typ, func(t *testing.T) {
			ctx := context.Background()
			fake := forgetest.Start(t, typ, "tok-123")
			fake.Grant("acme/widgets", "alice-gh", forge.PermWrite)
			fake.Grant("acme/widgets", "bob-gh", forge.PermRead)
			c, err := forge.New(forge.Config{Type: typ, APIURL: fake.URL, Token: "tok-123"})
			if err != nil {
				t.Fatal(err)
			}
			repo := forge.Repo{Owner: "acme", Name: "widgets"}
			for login, want := range map[string]forge.Permission{"alice-gh": forge.PermWrite, "bob-gh": forge.PermRead, "nobody": forge.PermNone} {
				got, err := c.Permission(ctx, repo, login)
				if err != nil || got != want {
					t.Errorf("Permission(%s) = %q, %v; want %q", login, got, err, want)
				}
			}
			if !forge.PermWrite.CanPush() || forge.PermRead.CanPush() {
				t.Error("CanPush: write pushes, read does not")
			}

			pr := forge.PullRequest{Title: "Fix it", Body: "body", Head: "atrium/t1", Base: "main"}
			opened, err := c.OpenPullRequest(ctx, repo, pr)
			if err != nil {
				t.Fatal(err)
			}
			prs := fake.PRs()
			if len(prs) != 1 || prs[0].PullRequest != pr || prs[0].Repo != "acme/widgets" || opened.URL != prs[0].URL || opened.Number != 1 {
				t.Fatalf("opened %+v, forge has %+v", opened, prs)
			}

			fake.SetDown(true)
			_, err = c.OpenPullRequest(ctx, repo, pr)
			var se *forge.StatusError
			if !dlq.IsTransient(err) || !errors.As(err, &se) || se.Status != http.StatusServiceUnavailable {
				t.Errorf("forge down: err = %v, want a transient 503", err)
			}
			fake.SetDown(false)

			bad, _ := forge.New(forge.Config{Type: typ, APIURL: fake.URL, Token: "wrong-token"})
			_, err = bad.OpenPullRequest(ctx, repo, pr)
			if dlq.IsTransient(err) || !errors.As(err, &se) || se.Status != http.StatusUnauthorized {
				t.Errorf("bad token: err = %v, want a permanent 401", err)
			}
			if strings.Contains(err.Error(), "wrong-token") {
				t.Errorf("error shows the token: %v", err)
			}
		})
	}
}

func TestClient_Unreachable(t *testing.T) {
	fake := forgetest.Start(t, forge.TypeGitHub, "x")
	url := fake.URL
	c, err := forge.New(forge.Config{Type: forge.TypeGitHub, APIURL: url, Token: "x"})
	if err != nil {
		t.Fatal(err)
	}
	fake.Close()
	_, err = c.Permission(context.Background(), forge.Repo{Owner: "a", Name: "b"}, "u")
	if !dlq.IsTransient(err) {
		t.Errorf("unreachable forge: err = %v, want transient", err)
	}
}

func TestNew_Errors(t *testing.T) {
	for name, cfg := range map[string]forge.Config{
		"type":  {Type: "gitlab", APIURL: "https://x", Token: "t"},
		"url":   {Type: forge.TypeGitHub, APIURL: "ftp://x", Token: "t"},
		"token": {Type: forge.TypeGitea, APIURL: "https://x"},
	} {
		if _, err := forge.New(cfg); err == nil {
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
}
