package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
)

// doctor runs `atrium doctor args…` and returns its stdout and error.
func doctor(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errs bytes.Buffer
	err := run(context.Background(), append([]string{"doctor"}, args...), strings.NewReader(""), &out, &errs, func(string) string { return "" })
	return out.String(), err
}

func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "atrium.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDoctor_AllGood(t *testing.T) {
	if _, err := os.Stat("/usr/bin/bwrap"); err != nil {
		t.Fatal("bubblewrap is missing: run .ci/deps")
	}
	data := t.TempDir()
	p := writeConfig(t, "listen: 127.0.0.1:0\ndata_dir: "+data+"\nauth:\n  mode: tokens\n")
	out, err := doctor(t, "--config", p, "--json")
	if err != nil {
		t.Fatalf("doctor: %v\n%s", err, out)
	}
	var checks []doctorCheck
	if err := json.Unmarshal([]byte(out), &checks); err != nil {
		t.Fatalf("doctor --json output: %v\n%s", err, out)
	}
	got := map[string]doctorCheck{}
	for _, c := range checks {
		got[c.Name] = c
	}
	for _, name := range []string{"config", "roles", "bubblewrap", "cgroups", "data dir", "nats store", "object store", "agents", "listen"} {
		c, ok := got[name]
		if !ok || !c.OK {
			t.Errorf("check %q = %+v (present %v), want ok", name, c, ok)
		}
	}
	if _, ok := got["oidc issuer"]; ok {
		t.Error("oidc issuer checked in tokens mode")
	}
	// The text form: one ✓ line per check and a summary.
	text, err := doctor(t, "--config", p)
	if err != nil || strings.Count(text, "✓ ") != len(checks) || !strings.Contains(text, "All 9 checks passed.") {
		t.Errorf("doctor text output (err %v):\n%s", err, text)
	}
}

func TestDoctor_SaysWhatToFix(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	issuer := httptest.NewServer(http.NotFoundHandler())
	defer issuer.Close()
	objects := filepath.Join(t.TempDir(), "objects")
	if err := os.WriteFile(objects, []byte("a file, not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := writeConfig(t, `listen: `+busy.Addr().String()+`
data_dir: `+t.TempDir()+`
storage:
  type: dir
  dir: `+objects+`/sub
auth:
  mode: oidc
  oidc:
    issuer: `+issuer.URL+`
    client_id: atrium
`)
	out, err := doctor(t, "--config", p)
	var ee exitError
	if !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(ee.msg, "checks failed") {
		t.Fatalf("doctor error = %v, want exit status 1 saying how many checks failed\n%s", err, out)
	}
	for _, want := range []string{
		"✗ config", // no cookie key
		"✗ object store",
		"✗ oidc issuer   discovery at " + issuer.URL + "/.well-known/openid-configuration answered 404",
		"✗ listen",
		"fix: stop what uses " + busy.Addr().String(),
		"fix: set auth.oidc.issuer",
		"✓ data dir",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}
}

func TestDoctor_BadFile(t *testing.T) {
	p := writeConfig(t, "listen: [not, a, string]\n")
	out, err := doctor(t, "--config", p)
	if err == nil || !strings.Contains(out, "✗ config") || !strings.Contains(out, "docs/configuration.md") {
		t.Errorf("doctor of a malformed file: err %v\n%s", err, out)
	}
}

// TestDoctor_Roles: a gateway-only process is checked against its external
// NATS (and not for sandboxes or the object store); an unreachable NATS says
// what to fix.
func TestDoctor_Roles(t *testing.T) {
	ns, err := natsserver.NewServer(&natsserver.Options{ServerName: "nats-doctor", Host: "127.0.0.1", Port: -1,
		JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	p := writeConfig(t, "listen: 127.0.0.1:0\ndata_dir: "+t.TempDir()+"\nauth: {mode: tokens}\nroles: [gateway]\nnode: {id: gw-1}\nnats: {urls: ['"+ns.ClientURL()+"']}\n")
	out, err := doctor(t, "--config", p)
	if err != nil {
		t.Fatalf("doctor: %v\n%s", err, out)
	}
	for _, want := range []string{"✓ roles         gateway (clients, web UI) as node id gw-1; NATS at " + ns.ClientURL(), "✓ nats          connected to nats-doctor"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}
	for _, absent := range []string{"bubblewrap", "object store", "nats store"} {
		if strings.Contains(out, absent) {
			t.Errorf("a gateway-only process was checked for %s:\n%s", absent, out)
		}
	}

	p = writeConfig(t, "listen: 127.0.0.1:0\ndata_dir: "+t.TempDir()+"\nauth: {mode: tokens}\nroles: [gateway]\nnats: {urls: ['nats://127.0.0.1:1'], replicas: 3}\n")
	out, err = doctor(t, "--config", p)
	if err == nil || !strings.Contains(out, "✗ nats          connect to NATS at nats://127.0.0.1:1") || !strings.Contains(out, "fix: start the NATS cluster") {
		t.Errorf("doctor with NATS down: err %v\n%s", err, out)
	}
}
