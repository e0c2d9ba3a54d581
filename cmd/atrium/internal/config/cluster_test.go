package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/config"
)

// The keys below are the ones the multi-process cluster tests and deploy/
// use: keep them.
func TestLoad_Cluster(t *testing.T) {
	p := write(t, `
roles: [node]
nats:
  urls: [nats://127.0.0.1:4222, nats://127.0.0.1:4223]
  creds: /etc/atrium/nats.creds
  tls: {ca: /etc/atrium/ca.pem}
  replicas: 3
  name: atrium-node-a
node:
  id: node-a
  lease_ttl: 2s
  drain_grace: 10s
  checkpoint_interval: 30s
auth: {mode: tokens}
`)
	f, err := config.Load(p, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Validate(false); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	if !f.HasRole(config.RoleNode) || f.HasRole(config.RoleGateway) || len(f.NATS.URLs) != 2 || f.NATS.Replicas != 3 ||
		f.NATS.Creds != "/etc/atrium/nats.creds" || f.NATS.TLS.CA != "/etc/atrium/ca.pem" || f.NATS.Name != "atrium-node-a" ||
		f.Node.ID != "node-a" || f.Node.LeaseTTL != 2*time.Second || f.Node.DrainGrace != 10*time.Second ||
		f.Node.CheckpointInterval != 30*time.Second {
		t.Fatalf("loaded %+v", f)
	}

	t.Run("external NATS lease default", func(t *testing.T) {
		f, err := config.Load(write(t, "nats: {urls: [nats://127.0.0.1:4222]}\n"), env(nil))
		if err != nil {
			t.Fatal(err)
		}
		if f.Node.LeaseTTL != config.DefaultLeaseTTL {
			t.Fatalf("lease TTL %v with an external NATS cluster, want %v", f.Node.LeaseTTL, config.DefaultLeaseTTL)
		}
	})

	t.Run("defaults", func(t *testing.T) {
		f, err := config.Load("", env(nil))
		if err != nil {
			t.Fatal(err)
		}
		if !f.HasRole(config.RoleGateway) || !f.HasRole(config.RoleNode) || len(f.NATS.URLs) != 0 || f.NATS.Replicas != 1 ||
			f.Node.ID == "" || f.NATS.Name != "atrium-"+f.Node.ID || f.Node.LeaseTTL != config.DefaultEmbeddedLeaseTTL ||
			f.Node.DrainGrace != config.DefaultDrainGrace || f.Node.CheckpointInterval != config.DefaultCheckpointInterval {
			t.Fatalf("defaults %+v", f)
		}
		if err := f.Validate(true); err != nil {
			t.Fatalf("defaults refused: %v", err)
		}
	})
	t.Run("environment", func(t *testing.T) {
		f, err := config.Load("", env(map[string]string{
			"ATRIUM_ROLES": "gateway", "ATRIUM_NATS_URLS": "tls://n1:4222,tls://n2:4222", "ATRIUM_NATS_REPLICAS": "3",
			"ATRIUM_NATS_USER": "atrium", "ATRIUM_NATS_PASSWORD": "pw-secret", "ATRIUM_NODE_ID": "gw-2",
			"ATRIUM_NODE_LEASE_TTL": "5s",
		}))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Validate(true); err != nil {
			t.Fatalf("refused: %v", err)
		}
		if strings.Join(f.Roles, ",") != "gateway" || len(f.NATS.URLs) != 2 || f.NATS.Replicas != 3 || f.NATS.Password != "pw-secret" ||
			f.Node.ID != "gw-2" || f.NATS.Name != "atrium-gw-2" || f.Node.LeaseTTL != 5*time.Second {
			t.Fatalf("loaded %+v", f)
		}
		out, err := f.Redacted()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), "pw-secret") || !strings.Contains(string(out), "roles:") {
			t.Fatalf("redacted:\n%s", out)
		}
	})
}

func TestValidate_Cluster(t *testing.T) {
	for name, c := range map[string]struct {
		yaml  string
		serve bool     // validate for `atrium serve` (default: `atrium dev`)
		want  []string // substrings; empty: valid
	}{
		"gateway alone":             {yaml: "roles: [gateway]\nnats: {urls: ['nats://n:4222']}\n"},
		"both, external, R3":        {yaml: "nats: {urls: ['nats://a:4222', 'nats://b:4222', 'nats://c:4222'], replicas: 3}\n"},
		"unknown role":              {yaml: "roles: [router]\n", want: []string{`roles: "router": want gateway, node`}},
		"role twice":                {yaml: "roles: [node, node]\nnats: {urls: ['nats://n:4222']}\n", want: []string{`"node" is listed twice`}},
		"one role, embedded":        {yaml: "roles: [node]\n", want: []string{"nats.urls: required with roles [node]"}},
		"bad url":                   {yaml: "nats: {urls: ['http://n:4222', 'n:4222']}\n", want: []string{"scheme must be nats", `"n:4222"`}},
		"credentials in url":        {yaml: "nats: {urls: ['nats://u:p@n:4222']}\n", want: []string{"carries credentials"}},
		"two auths":                 {yaml: "nats: {urls: ['nats://n:4222'], creds: a.creds, nkey: seed.nk}\n", want: []string{"set one of nats.creds"}},
		"user without password":     {yaml: "nats: {urls: ['nats://n:4222'], user: atrium}\n", want: []string{"nats.user and nats.password"}},
		"cert without key":          {yaml: "nats: {urls: ['tls://n:4222'], tls: {cert: c.pem}}\n", want: []string{"nats.tls.cert"}},
		"creds with embedded":       {yaml: "nats: {creds: a.creds}\n", want: []string{"nats.creds: applies only to an external"}},
		"replicas with embedded":    {yaml: "nats: {replicas: 3}\n", want: []string{"nats.replicas: 3 needs an external NATS cluster"}},
		"too many replicas":         {yaml: "nats: {urls: ['nats://n:4222'], replicas: 7}\n", want: []string{"nats.replicas: 7: want 1 to 5"}},
		"bad node id":               {yaml: "node: {id: 'node a.b'}\n", want: []string{`node.id: "node a.b"`}},
		"short lease":               {yaml: "node: {lease_ttl: 100ms}\n", want: []string{"node.lease_ttl: 100ms is too short"}},
		"negative drain":            {yaml: "node: {drain_grace: -1s}\n", want: []string{"node.drain_grace: must be positive"}},
		"short checkpoints":         {yaml: "node: {checkpoint_interval: 10ms}\n", want: []string{"node.checkpoint_interval"}},
		"unknown nats key":          {yaml: "nats: {url: 'nats://n:4222'}\n", want: []string{"unknown key url in nats: did you mean urls?"}},
		"serve: node needs no auth": {yaml: "roles: [node]\nnats: {urls: ['nats://n:4222']}\n", serve: true},
		"serve: node ignores dev":   {yaml: "roles: [node]\nauth: {mode: dev}\nnats: {urls: ['nats://n:4222']}\n", serve: true},
		"serve: gateway needs auth": {yaml: "roles: [gateway]\nnats: {urls: ['nats://n:4222']}\n", serve: true, want: []string{"auth.mode: required"}},
		"serve: gateway not dev":    {yaml: "roles: [gateway]\nauth: {mode: dev}\nnats: {urls: ['nats://n:4222']}\n", serve: true, want: []string{"only for `atrium dev`"}},
	} {
		t.Run(name, func(t *testing.T) {
			f, err := config.Load(write(t, c.yaml), env(nil))
			if err == nil {
				err = f.Validate(!c.serve)
			}
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
