package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/config"
)

const goodKey = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=" // 32 bytes

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "atrium.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestLoad_DefaultsAndEnv(t *testing.T) {
	p := write(t, `
listen: 0.0.0.0:8080
auth:
  mode: oidc
  oidc:
    issuer: https://id.example.com
    client_id: atrium
    tenant_claim: org
node:
  hibernate_after: 1m
`)
	f, err := config.Load(p, env(map[string]string{
		"ATRIUM_AUTH_COOKIE_KEY":         goodKey,
		"ATRIUM_AUTH_OIDC_CLIENT_SECRET": "s3cret",
		"ATRIUM_NODE_TURN_TIMEOUT":       "5m",
		"ATRIUM_ALLOWED_ORIGINS":         "https://a.example.com, https://b.example.com",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Validate(false); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	if f.Listen != "0.0.0.0:8080" || f.Node.HibernateAfter != time.Minute || f.Node.TurnTimeout != 5*time.Minute ||
		f.Node.CancelGrace != config.DefaultCancelGrace || f.Auth.OIDC.ClientSecret != "s3cret" ||
		f.Auth.OIDC.CLIClientID != "atrium" || len(f.AllowedOrigins) != 2 || f.Auth.OIDC.UserClaim != "email" {
		t.Fatalf("loaded %+v", f)
	}
	out, err := f.Redacted()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "s3cret") || strings.Contains(string(out), goodKey) || !strings.Contains(string(out), "<redacted>") {
		t.Fatalf("secrets not redacted:\n%s", out)
	}
	if f.Auth.OIDC.ClientSecret != "s3cret" {
		t.Fatal("Redacted changed the config itself")
	}
}

func TestLoad_Errors(t *testing.T) {
	for name, c := range map[string]struct {
		yaml string
		env  map[string]string
		want string
	}{
		"unknown key":    {yaml: "listen: 127.0.0.1:1\nlisten_addr: x\n", want: "unknown key listen_addr at the top level: did you mean listen?"},
		"nested unknown": {yaml: "auth:\n  oidc:\n    issuerr: x\n", want: "unknown key issuerr in auth.oidc: did you mean issuer?"},
		"bad duration":   {yaml: "node:\n  turn_timeout: soon\n", want: "line 2: cannot unmarshal !!str `soon` into time.Duration"},
		"bad env":        {env: map[string]string{"ATRIUM_NODE_CANCEL_GRACE": "soon"}, want: "ATRIUM_NODE_CANCEL_GRACE"},
		"two documents":  {yaml: "listen: 127.0.0.1:1\n---\nlisten: 127.0.0.1:2\n", want: "more than one"},
	} {
		t.Run(name, func(t *testing.T) {
			p := ""
			if c.yaml != "" {
				p = write(t, c.yaml)
			}
			_, err := config.Load(p, env(c.env))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error with %q", err, c.want)
			}
		})
	}
	if _, err := config.Load(filepath.Join(t.TempDir(), "missing.yaml"), env(nil)); err == nil {
		t.Fatal("a missing file was accepted")
	}
}

func TestValidate(t *testing.T) {
	for name, c := range map[string]struct {
		yaml string
		dev  bool
		want []string // substrings; empty: valid
	}{
		"serve needs a mode":   {yaml: "", want: []string{"auth.mode: required"}},
		"dev needs nothing":    {yaml: "", dev: true},
		"dev mode not serve":   {yaml: "auth:\n  mode: dev\n", want: []string{"only for `atrium dev`"}},
		"tokens only":          {yaml: "auth:\n  mode: tokens\n"},
		"oidc incomplete":      {yaml: "auth:\n  mode: oidc\n", want: []string{"auth.oidc.issuer: required", "auth.oidc.client_id", "auth.oidc.tenant_claim", "auth.cookie_key: required", "openssl rand"}},
		"oidc http issuer":     {yaml: "auth:\n  mode: oidc\n  cookie_key: " + goodKey + "\n  oidc: {issuer: 'http://id.example.com', client_id: a, default_tenant: t}\n", want: []string{"must be an https URL"}},
		"oidc loopback http":   {yaml: "auth:\n  mode: oidc\n  cookie_key: " + goodKey + "\n  oidc: {issuer: 'http://127.0.0.1:5556', client_id: a, default_tenant: t}\n"},
		"both tenant kinds":    {yaml: "auth:\n  mode: oidc\n  cookie_key: " + goodKey + "\n  oidc: {issuer: 'https://x', client_id: a, tenant_claim: org, default_tenant: t}\n", want: []string{"not both"}},
		"short cookie key":     {yaml: "auth:\n  mode: oidc\n  cookie_key: c2hvcnQ=\n  oidc: {issuer: 'https://x', client_id: a, default_tenant: t}\n", want: []string{"5 bytes is too short"}},
		"bad log":              {yaml: "auth: {mode: tokens}\nlog: {format: xml, level: loud, access: maybe}\n", want: []string{"log.format", "log.level", "log.access"}},
		"access log off":       {yaml: "auth: {mode: tokens}\nlog: {access: 'off'}\n"},
		"history cache off":    {yaml: "auth: {mode: tokens}\nhistory_cache_bytes: -1\n"},
		"history cache bad":    {yaml: "auth: {mode: tokens}\nhistory_cache_bytes: -2\n", want: []string{"history_cache_bytes: -2"}},
		"remote without hook":  {yaml: "auth: {mode: tokens}\nsandbox: {provider: remote}\n", want: []string{"sandbox.remote", "storage.type: remote sandboxes need s3"}},
		"s3 incomplete":        {yaml: "auth: {mode: tokens}\nstorage: {type: s3, s3: {endpoint: 'http://x:9000'}}\n", want: []string{"without a scheme", "storage.s3.bucket", "access_key"}},
		"bad egress":           {yaml: "auth: {mode: tokens}\nsandbox: {cpus: -1, egress: ['*', 'github.com']}\n", want: []string{"sandbox.cpus", "sandbox.egress"}},
		"egress and cpus":      {yaml: "auth: {mode: tokens}\nsandbox: {cpus: 1.5, egress: ['github.com', '*.example.com', 'proxy.internal:8080']}\n"},
		"bad egress permit":    {yaml: "auth: {mode: tokens}\nsandbox: {egress_permit: ['http://x']}\n", want: []string{"sandbox.egress_permit"}},
		"bad listen":           {yaml: "auth: {mode: tokens}\nlisten: nowhere\n", want: []string{"listen:"}},
		"remote with s3 works": {yaml: "auth: {mode: tokens}\nsandbox: {provider: remote, remote: {url: 'http://hook'}}\nstorage: {type: s3, s3: {endpoint: 's3:9000', bucket: b, access_key: k, secret_key: s}}\n"},
		"vm hosts work":        {yaml: "auth: {mode: tokens}\nsandbox: {provider: remote, remote: {vm_hosts: [{url: 'http://10.0.0.5:7000', token_file: /etc/t}]}}\nstorage: {type: s3, s3: {endpoint: 's3:9000', bucket: b, access_key: k, secret_key: s}}\n"},
		"bad vm hosts":         {yaml: "auth: {mode: tokens}\nsandbox: {provider: remote, remote: {vm_hosts: [{url: '10.0.0.5:7000'}]}}\nstorage: {type: s3, s3: {endpoint: 's3:9000', bucket: b, access_key: k, secret_key: s}}\n", want: []string{"vm_hosts[0].url", "vm_hosts[0].token_file: required"}},
		"vm hosts and url":     {yaml: "auth: {mode: tokens}\nsandbox: {provider: remote, remote: {url: 'http://hook', vm_hosts: [{url: 'http://h:7000', token_file: /t}]}}\nstorage: {type: s3, s3: {endpoint: 's3:9000', bucket: b, access_key: k, secret_key: s}}\n", want: []string{"sandbox.remote: set one of"}},
	} {
		t.Run(name, func(t *testing.T) {
			p := ""
			if c.yaml != "" {
				p = write(t, c.yaml)
			}
			f, err := config.Load(p, env(nil))
			if err != nil {
				t.Fatal(err)
			}
			err = f.Validate(c.dev)
			if len(c.want) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}
