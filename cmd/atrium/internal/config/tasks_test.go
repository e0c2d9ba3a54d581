package config

import (
	"strings"
	"testing"
)

func TestTasks_Check(t *testing.T) {
	ok := Forge{Host: "github.com", Type: "github", APIURL: "https://api.github.com", TokenEnv: "GH", Users: map[string]string{"alice": "alice-gh"}}
	if errs := (Tasks{Forges: []Forge{ok}}).check(); len(errs) != 0 {
		t.Fatalf("valid forge: %v", errs)
	}
	for name, tc := range map[string]struct {
		mut  func(f *Forge)
		want string
	}{
		"type":    {func(f *Forge) { f.Type = "gitlab" }, "tasks.forges[0].type"},
		"api_url": {func(f *Forge) { f.APIURL = "api.github.com" }, "tasks.forges[0].api_url"},
		"token":   {func(f *Forge) { f.TokenEnv = "" }, "tasks.forges[0].token_env"},
		"both":    {func(f *Forge) { f.Token = "x" }, "tasks.forges[0].token_env"},
		"users":   {func(f *Forge) { f.Users = nil }, "tasks.forges[0].users"},
		"host":    {func(f *Forge) { f.Host = "https://github.com" }, "tasks.forges[0].host"},
	} {
		f := ok
		tc.mut(&f)
		errs := (Tasks{Forges: []Forge{f}}).check()
		if len(errs) == 0 || !strings.Contains(errs[0].Error(), tc.want) {
			t.Errorf("%s: %v, want an error about %s", name, errs, tc.want)
		}
	}
	if errs := (Tasks{Forges: []Forge{ok, ok}}).check(); len(errs) == 0 || !strings.Contains(errs[0].Error(), "twice") {
		t.Errorf("duplicate host: %v", errs)
	}
	if _, err := (Tasks{Forges: []Forge{ok}}).Gateway(func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "GH is not set") {
		t.Errorf("unset token env: %v", err)
	}
	g, err := (Tasks{Forges: []Forge{ok}, Attempts: 2}).Gateway(func(k string) string { return map[string]string{"GH": "tok"}[k] })
	if err != nil || len(g.Service.Forges) != 1 || g.Service.Forges[0].Token != "tok" || g.Service.Backoff.Attempts != 2 {
		t.Errorf("Gateway: %+v, %v", g, err)
	}
}
