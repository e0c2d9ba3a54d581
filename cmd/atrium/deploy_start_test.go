package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/oauth2-proxy/mockoidc"

	"github.com/atriumhq/atrium/cmd/atrium/internal/config"
	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

// These tests start every configuration shipped in deploy/ the way its
// deployment would (atrium serve, or atrium dev for deploy/cluster's
// gateways), through the same code as the commands (config.Load, Validate,
// serverConfig), and wait for /readyz. What a configuration names outside
// Atrium runs in-process or on loopback: its NATS cluster as nats-servers
// made from deploy/nats, its S3 store as versitygw, its OpenID Connect
// provider as mockoidc. Only addresses, directories and secrets are
// overridden, through the ATRIUM_* variables a deployment would set.

// deployedProcess is one Atrium process started from a shipped
// configuration.
type deployedProcess struct {
	name string
	srv  *server.Server
}

// startDeployed loads path with env, validates it as `atrium serve` (or,
// with dev, `atrium dev`) would, starts the server and waits for /readyz.
func startDeployed(t *testing.T, name, path string, env map[string]string, dev bool) *deployedProcess {
	t.Helper()
	getenv := func(k string) string { return env[k] }
	f, err := config.Load(path, getenv)
	if err != nil {
		t.Fatalf("%s: load %s: %v", name, path, err)
	}
	if dev && f.Auth.Mode == "" {
		f.Auth.Mode = config.AuthDev
	}
	if err := f.Validate(dev); err != nil {
		t.Fatalf("%s: %s is not valid:\n%v", name, path, err)
	}
	cfg, err := serverConfig(f, io.Discard, getenv)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	srv, err := server.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("%s: start from %s: %v", name, path, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("%s: close: %v", name, err)
		}
	})
	waitReady(t, name, srv.URL())
	return &deployedProcess{name: name, srv: srv}
}

// waitReady polls url's /readyz until it answers 200.
func waitReady(t *testing.T, name, url string) {
	t.Helper()
	deadline := time.Now().Add(e2eWait)
	var last string
	for {
		resp, err := http.Get(url + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: /readyz not ready within %v: %s", name, e2eWait, last)
		}
		time.Sleep(50 * time.Millisecond) // Polling interval.
	}
}

// freeLoopbackPort returns a port free on 127.0.0.1 a moment ago.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startDeployNATS runs deploy/nats's three servers (nats-1..3.conf) as they
// are configured — names, JetStream, the cluster and its routes — on free
// loopback ports and temporary store dirs, and returns their client URLs
// once JetStream has a leader.
func startDeployNATS(t *testing.T) []string {
	t.Helper()
	var (
		opts   []*natsserver.Options
		routes []string
	)
	for i := 1; i <= 3; i++ {
		o, err := natsserver.ProcessConfigFile(filepath.Join(deployDir, "nats", fmt.Sprintf("nats-%d.conf", i)))
		if err != nil {
			t.Fatal(err)
		}
		o.Port, o.HTTPPort = freeLoopbackPort(t), 0
		o.Cluster.Port = freeLoopbackPort(t)
		o.StoreDir = t.TempDir()
		o.NoSigs, o.NoLog = true, true
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", o.Cluster.Port))
		opts = append(opts, o)
	}
	var urls []string
	for _, o := range opts {
		o.Routes = natsserver.RoutesFromStr(strings.Join(routes, ","))
		ns, err := natsserver.NewServer(o)
		if err != nil {
			t.Fatalf("nats-server %s: %v", o.ServerName, err)
		}
		ns.Start()
		t.Cleanup(func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		})
		if !ns.ReadyForConnections(e2eWait) {
			t.Fatalf("nats-server %s not ready", o.ServerName)
		}
		urls = append(urls, ns.ClientURL())
	}
	return urls
}

// TestDeploy_ExampleConfigServes starts deploy/atrium.yaml (API tokens only)
// as `atrium serve`, then follows docs/auth.md's bootstrap: the first token
// is made on the server's machine from its data directory, and works.
func TestDeploy_ExampleConfigServes(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	p := startDeployed(t, "atrium.yaml", filepath.Join(deployDir, "atrium.yaml"), map[string]string{
		"ATRIUM_LISTEN": "127.0.0.1:0", "ATRIUM_DATA_DIR": data, "ATRIUM_STORAGE_DIR": filepath.Join(data, "objects"),
	}, false)
	if st, err := os.Stat(filepath.Join(data, auth.BootstrapKeyFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("bootstrap key: %v %v, want a 0600 file in the data dir", st, err)
	}
	c := newCLI(t, p.srv.URL())
	// Issue 23: the operator of a fresh install was locked out.
	if _, errs, err := c.run(cliContext(t), nil, "token", "create", "--name", "x"); err == nil || !strings.Contains(errs+err.Error(), "--bootstrap") {
		t.Errorf("token create without credentials on a token-mode server: %v, want a hint at --bootstrap", err)
	}
	// Another data dir's key is refused, saying what to check.
	otherDir := t.TempDir()
	if _, err := auth.EnsureBootstrapKey(otherDir); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.run(cliContext(t), nil, "token", "create", "--bootstrap", "--data", otherDir, "--name", "x"); err == nil ||
		!strings.Contains(err.Error(), "refused the bootstrap key") || !strings.Contains(err.Error(), "data directory") {
		t.Errorf("token create --bootstrap with another server's key: %v", err)
	}
	if _, _, err := c.run(cliContext(t), nil, "token", "create", "--bootstrap", "--data", t.TempDir(), "--name", "x"); err == nil ||
		!strings.Contains(err.Error(), "no bootstrap key in") {
		t.Errorf("token create --bootstrap without a key: %v", err)
	}
	tok := strings.TrimSpace(c.ok("token", "create", "--bootstrap", "--data", data, "--user", "admin", "--name", "first"))
	if !strings.HasPrefix(tok, auth.TokenPrefix) {
		t.Fatalf("token create --bootstrap printed %q", tok)
	}
	c.env["ATRIUM_TOKEN"] = tok
	if who := c.ok("whoami"); !strings.Contains(who, "admin") {
		t.Fatalf("whoami with the bootstrap-made token:\n%s", who)
	}
	if out := c.ok("cluster", "status"); !strings.Contains(out, p.srv.NodeID()) {
		t.Errorf("the bootstrap-made token is an operator: cluster status\n%s", out)
	}
	// A wrong token is called one.
	c.env["ATRIUM_TOKEN"] = "not-a-token"
	if _, _, err := c.run(cliContext(t), nil, "ls"); err == nil || !strings.Contains(err.Error(), "invalid token") {
		t.Errorf("ls with a wrong token: %v, want invalid token", err)
	}
	c.env["ATRIUM_TOKEN"] = tok[:len(tok)-4] + "aaaa"
	if _, _, err := c.run(cliContext(t), nil, "ls"); err == nil || !strings.Contains(err.Error(), "invalid token") {
		t.Errorf("ls with a wrong API token: %v, want invalid token", err)
	}
	// The key does nothing but make tokens.
	key, err := auth.ReadBootstrapKey(data)
	if err != nil {
		t.Fatal(err)
	}
	c.env["ATRIUM_TOKEN"] = auth.BootstrapToken(key, "admin", "")
	if _, _, err := c.run(cliContext(t), nil, "ls"); err == nil || !strings.Contains(err.Error(), "only creates API tokens") {
		t.Errorf("ls with the bootstrap key: %v, want a refusal", err)
	}
}

// TestDeploy_ClusterConfigsServe starts deploy/cluster's one-machine
// cluster: its three NATS servers from deploy/nats, its two nodes
// (atrium serve) and its two gateways (atrium dev), each serving /readyz.
func TestDeploy_ClusterConfigsServe(t *testing.T) {
	t.Parallel()
	urls := startDeployNATS(t)
	objects := t.TempDir()
	for _, name := range []string{"node-a", "node-b", "gateway-1", "gateway-2"} {
		env := map[string]string{
			"ATRIUM_LISTEN": "127.0.0.1:0", "ATRIUM_DATA_DIR": t.TempDir(), "ATRIUM_NATS_URLS": strings.Join(urls, ","),
			"ATRIUM_STORAGE_DIR": objects,
		}
		startDeployed(t, name, filepath.Join(deployDir, "cluster", name+".yaml"), env, strings.HasPrefix(name, "gateway"))
	}
}

// deployS3Env points a configuration's S3 store at a versitygw.
func deployS3Env(s3 *blobtest.S3Server) map[string]string {
	return map[string]string{
		"ATRIUM_STORAGE_S3_ENDPOINT": s3.Endpoint, "ATRIUM_STORAGE_S3_BUCKET": s3.Bucket,
		"ATRIUM_STORAGE_S3_ACCESS_KEY": s3.AccessKey, "ATRIUM_STORAGE_S3_SECRET_KEY": s3.SecretKey,
		"ATRIUM_STORAGE_S3_INSECURE": "true",
	}
}

// TestDeploy_KubernetesConfigServes starts the ConfigMap's atrium.yaml as
// the gateway Deployment and the node StatefulSet run it (roles and node ids
// from the environment), with its OIDC provider, NATS cluster and S3 store
// on loopback.
func TestDeploy_KubernetesConfigServes(t *testing.T) {
	t.Parallel()
	docs, err := yamlDocs(filepath.Join(deployDir, "kubernetes", "config.yaml"))
	if err != nil || len(docs) != 1 {
		t.Fatalf("kubernetes/config.yaml: %v", err)
	}
	yml, _ := dig(docs[0], "data", "atrium.yaml").(string)
	if yml == "" {
		t.Fatal("kubernetes/config.yaml has no data.atrium.yaml")
	}
	path := filepath.Join(t.TempDir(), "atrium.yaml")
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := mockoidc.Run()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Shutdown() })
	urls := startDeployNATS(t)
	s3 := blobtest.StartS3(t)
	key := make([]byte, 32)
	rand.Read(key)
	for _, w := range []struct{ name, roles string }{{"node-0", "node"}, {"node-1", "node"}, {"gateway", "gateway"}} {
		env := deployS3Env(s3)
		for k, v := range map[string]string{
			"ATRIUM_ROLES": w.roles, "ATRIUM_NODE_ID": w.name,
			"ATRIUM_LISTEN": "127.0.0.1:0", "ATRIUM_DATA_DIR": t.TempDir(), "ATRIUM_NATS_URLS": strings.Join(urls, ","),
			"ATRIUM_AUTH_OIDC_ISSUER": m.Issuer(), "ATRIUM_AUTH_OIDC_CLIENT_ID": m.ClientID,
			"ATRIUM_AUTH_OIDC_CLIENT_SECRET": m.ClientSecret, "ATRIUM_AUTH_COOKIE_KEY": base64.StdEncoding.EncodeToString(key),
		} {
			env[k] = v
		}
		startDeployed(t, w.name, path, env, false)
	}
}

// TestDeploy_ComposeServes starts deploy/compose.yaml's services — the
// single `atrium` service, and the cluster profile's gateway and nodes —
// from deploy/atrium.yaml with each service's environment, against
// versitygw for its `s3` service and deploy/nats for its NATS servers.
func TestDeploy_ComposeServes(t *testing.T) {
	t.Parallel()
	docs, err := yamlDocs(filepath.Join(deployDir, "compose.yaml"))
	if err != nil || len(docs) != 1 {
		t.Fatalf("compose.yaml: %v", err)
	}
	s3 := blobtest.StartS3(t)
	var urls []string
	services, _ := docs[0]["services"].(map[string]any)
	var names []string
	for name, svc := range services {
		if envMap, ok := dig(svc, "environment").(map[string]any); ok && envMap["ATRIUM_STORAGE_TYPE"] != nil {
			names = append(names, name)
		}
	}
	if len(names) < 4 {
		t.Fatalf("compose.yaml has %d Atrium services (%v), want atrium and the cluster's gateway and two nodes", len(names), names)
	}
	// Nodes first: a gateway is ready once it can reach NATS, a node once
	// it holds its lease.
	for _, name := range names {
		envMap := dig(services[name], "environment").(map[string]any)
		env := map[string]string{}
		for k, v := range envMap {
			env[k] = fmt.Sprint(v)
		}
		for k, v := range deployS3Env(s3) {
			env[k] = v
		}
		env["ATRIUM_LISTEN"], env["ATRIUM_DATA_DIR"] = "127.0.0.1:0", t.TempDir()
		if env["ATRIUM_NATS_URLS"] != "" {
			if urls == nil {
				urls = startDeployNATS(t)
			}
			env["ATRIUM_NATS_URLS"] = strings.Join(urls, ",")
		}
		startDeployed(t, "compose "+name, filepath.Join(deployDir, "atrium.yaml"), env, false)
	}
}
