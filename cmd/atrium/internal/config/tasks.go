package config

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/dlq"
	"github.com/atriumhq/atrium/gateway/forge"
	"github.com/atriumhq/atrium/gateway/task"
)

// Tasks configures repository tasks (docs/automation.md, "Repository
// tasks"): the forges whose repositories tasks may work on.
//
//	tasks:
//	  callback_secret_env: ATRIUM_TASK_CALLBACK_SECRET   # optional: allows callback_url
//	  forges:
//	    - host: github.com
//	      type: github
//	      api_url: https://api.github.com
//	      token_env: GITHUB_TOKEN
//	      users: {alice: alice-gh}
//
// A forge's token is used to check permissions, to open pull requests, and
// (as a short-lived session secret) by the task's sandbox to clone and push.
// Each Atrium user who may run tasks is mapped to their login on the forge;
// the permission check asks the forge for that login's access (write or
// admin is needed). The sandbox reaches the forge's host through the egress
// proxy, so sandbox.egress_permit must cover each forge's host.
type Tasks struct {
	// CallbackSecretEnv names the environment variable holding the secret
	// that signs callback_url notifications; unset: callback_url refused.
	CallbackSecretEnv string  `yaml:"callback_secret_env"`
	Forges            []Forge `yaml:"forges"`
	// Attempts, RetryBase and RetryMax tune the retries of transient
	// failures (dlq.Backoff); zero: its defaults (5 attempts, 1s, 1m).
	Attempts  int           `yaml:"attempts"`
	RetryBase time.Duration `yaml:"retry_base"`
	RetryMax  time.Duration `yaml:"retry_max"`
	// TurnTimeout bounds how long a task's turn is followed; default 1h.
	TurnTimeout time.Duration `yaml:"turn_timeout"`
}

// Forge is one forge of Tasks.
type Forge struct {
	// Host is the host of repository URLs (with :port if not default).
	Host string `yaml:"host"`
	// Type is github or gitea (Forgejo too).
	Type string `yaml:"type"`
	// APIURL is https://api.github.com for GitHub, the site's URL for
	// Gitea and Forgejo.
	APIURL string `yaml:"api_url"`
	// TokenEnv names the environment variable holding the token (better
	// than Token, which puts it in the file).
	TokenEnv string `yaml:"token_env"`
	Token    string `yaml:"token"`
	// GitUsername goes with the token over HTTPS; default x-access-token.
	GitUsername string `yaml:"git_username"`
	// Users maps Atrium users to forge logins.
	Users map[string]string `yaml:"users"`
}

func (t Tasks) check() []error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if t.Attempts < 0 || t.RetryBase < 0 || t.RetryMax < 0 || t.TurnTimeout < 0 {
		bad("tasks", "attempts, retry_base, retry_max and turn_timeout must not be negative")
	}
	hosts := map[string]bool{}
	for i, f := range t.Forges {
		key := fmt.Sprintf("tasks.forges[%d]", i)
		switch {
		case f.Host == "" || strings.ContainsAny(f.Host, "/ "):
			bad(key+".host", "%q: give the host of repository URLs, e.g. github.com", f.Host)
		case hosts[strings.ToLower(f.Host)]:
			bad(key+".host", "%s is configured twice", f.Host)
		}
		hosts[strings.ToLower(f.Host)] = true
		if f.Type != forge.TypeGitHub && f.Type != forge.TypeGitea {
			bad(key+".type", "%q: want github or gitea (gitea also serves Forgejo)", f.Type)
		}
		if u, err := url.Parse(f.APIURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			bad(key+".api_url", "%q is not an http(s) URL (https://api.github.com for GitHub, the site URL for Gitea)", f.APIURL)
		}
		if (f.Token == "") == (f.TokenEnv == "") {
			bad(key+".token_env", "set token_env (the environment variable holding the forge's token) or token, one of them")
		}
		if len(f.Users) == 0 {
			bad(key+".users", "map at least one Atrium user to a %s login (users: {alice: alice-login})", f.Host)
		}
	}
	return errs
}

// Gateway returns the gateway's task configuration (its DLQ is set by the
// server), or nil without forges. Tokens are read from the environment.
func (t Tasks) Gateway(getenv func(string) string) (*gateway.Tasks, error) {
	if len(t.Forges) == 0 {
		return nil, nil
	}
	if errs := t.check(); len(errs) > 0 {
		return nil, errs[0]
	}
	out := &gateway.Tasks{Service: task.Config{
		Backoff:     dlq.Backoff{Base: t.RetryBase, Max: t.RetryMax, Attempts: t.Attempts},
		TurnTimeout: t.TurnTimeout,
	}}
	if t.CallbackSecretEnv != "" {
		secret := getenv(t.CallbackSecretEnv)
		if secret == "" {
			return nil, fmt.Errorf("tasks.callback_secret_env: the environment variable %s is not set", t.CallbackSecretEnv)
		}
		out.Service.Notifier = &task.SignedPoster{Secret: []byte(secret)}
	}
	for i, f := range t.Forges {
		token := f.Token
		if f.TokenEnv != "" {
			if token = getenv(f.TokenEnv); token == "" {
				return nil, fmt.Errorf("tasks.forges[%d].token_env: the environment variable %s is not set", i, f.TokenEnv)
			}
		}
		api, err := forge.New(forge.Config{Type: f.Type, APIURL: f.APIURL, Token: token})
		if err != nil {
			return nil, fmt.Errorf("tasks.forges[%d]: %w", i, err)
		}
		out.Service.Forges = append(out.Service.Forges, task.Forge{
			Host: f.Host, Type: f.Type, API: api, Token: token, GitUsername: f.GitUsername, Users: f.Users,
		})
	}
	return out, nil
}
