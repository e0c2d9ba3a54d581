package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"gopkg.in/yaml.v3"

	"github.com/atriumhq/atrium/cmd/atrium/internal/config"
	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
)

const deployDir = "../../deploy"

// TestDeploy_YAMLParses: every YAML file in deploy/ parses, every document
// of it (Kubernetes manifests hold several).
func TestDeploy_YAMLParses(t *testing.T) {
	n := 0
	err := filepath.WalkDir(deployDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || (filepath.Ext(p) != ".yaml" && filepath.Ext(p) != ".yml") {
			return err
		}
		n++
		docs, err := yamlDocs(p)
		if err != nil {
			t.Errorf("%s: %v", p, err)
		} else if len(docs) == 0 {
			t.Errorf("%s has no YAML document", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 15 {
		t.Errorf("only %d YAML files in deploy/", n)
	}
}

// yamlDocs decodes every document of a YAML file.
func yamlDocs(path string) ([]map[string]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var docs []map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var v map[string]any
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		if v != nil {
			docs = append(docs, v)
		}
	}
}

// TestDeploy_ClusterConfigsAreValid: the one-machine cluster's files pass
// validation (gateways as `atrium dev` runs them, nodes as `atrium serve`),
// name distinct nodes and addresses, and agree on NATS.
func TestDeploy_ClusterConfigsAreValid(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join(deployDir, "cluster", "*.yaml"))
	if err != nil || len(paths) != 4 {
		t.Fatalf("deploy/cluster has %d configs (%v), want 2 gateways and 2 nodes", len(paths), err)
	}
	ids, listens := map[string]string{}, map[string]string{}
	roles := map[string]int{}
	for _, p := range paths {
		f, err := config.Load(p, func(string) string { return "" })
		if err != nil {
			t.Fatalf("load %s: %v", p, err)
		}
		dev := f.Auth.Mode == config.AuthDev && f.HasRole(config.RoleGateway)
		if err := f.Validate(dev); err != nil {
			t.Errorf("%s is not valid (dev %v):\n%v", p, dev, err)
		}
		if len(f.Roles) != 1 || len(f.NATS.URLs) != 3 || f.NATS.Replicas != 3 {
			t.Errorf("%s: roles %v, nats %+v: want one role on the 3-server cluster with 3 replicas", p, f.Roles, f.NATS)
		}
		roles[f.Roles[0]]++
		if other, dup := ids[f.Node.ID]; dup {
			t.Errorf("%s and %s share node id %s", p, other, f.Node.ID)
		}
		ids[f.Node.ID] = p
		if other, dup := listens[f.Listen]; dup {
			t.Errorf("%s and %s both listen on %s", p, other, f.Listen)
		}
		listens[f.Listen] = p
		if f.HasRole(config.RoleNode) && f.Storage.Dir == "" && f.Storage.Type != "s3" {
			t.Errorf("%s: nodes must share an object store", p)
		}
	}
	if roles[config.RoleGateway] != 2 || roles[config.RoleNode] != 2 {
		t.Errorf("roles %v, want 2 gateways and 2 nodes", roles)
	}
}

// TestDeploy_NATSConfigsParse: nats-server reads every file in deploy/nats,
// and the one-machine cluster's three servers route to each other.
func TestDeploy_NATSConfigsParse(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join(deployDir, "nats", "*.conf"))
	if err != nil || len(paths) < 4 {
		t.Fatalf("deploy/nats has %d files (%v)", len(paths), err)
	}
	clientPorts := map[int]bool{}
	for _, p := range paths {
		opts, err := natsserver.ProcessConfigFile(p)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if !opts.JetStream || opts.Cluster.Name != "atrium" || len(opts.Routes) != 3 {
			t.Errorf("%s: jetstream %v, cluster %q, %d routes: want JetStream in cluster atrium with 3 routes", p, opts.JetStream, opts.Cluster.Name, len(opts.Routes))
		}
		// docs/scale-out.md: a vanished node's subscriptions go within
		// about 10 s, not the default 4 minutes.
		if opts.PingInterval != 5*time.Second || opts.MaxPingsOut != 2 {
			t.Errorf("%s: ping_interval %v, ping_max %d: want 5s and 2", p, opts.PingInterval, opts.MaxPingsOut)
		}
		if strings.HasPrefix(filepath.Base(p), "nats-") && filepath.Base(p) != "nats-cluster.conf" {
			clientPorts[opts.Port] = true
		}
	}
	for _, port := range []int{4222, 4223, 4224} {
		if !clientPorts[port] {
			t.Errorf("no local NATS server listens on %d (deploy/cluster's nats.urls)", port)
		}
	}
}

// TestDeploy_Kubernetes checks the manifests against what Atrium needs:
// every file kustomize lists exists; the ConfigMap's atrium.yaml is valid for
// each workload's role and environment; pods run the atrium image with
// probes on /healthz and /readyz and a termination grace longer than the
// node's drain grace; both components have a PodDisruptionBudget; the
// gateway has a Service, an HPA and an Ingress with long timeouts; nodes
// keep data_dir on a volume claim.
func TestDeploy_Kubernetes(t *testing.T) {
	dir := filepath.Join(deployDir, "kubernetes")
	kust, err := yamlDocs(filepath.Join(dir, "kustomization.yaml"))
	if err != nil || len(kust) != 1 {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	byKind := map[string][]map[string]any{}
	for _, r := range kust[0]["resources"].([]any) {
		docs, err := yamlDocs(filepath.Join(dir, r.(string)))
		if err != nil {
			t.Fatalf("resource %s: %v", r, err)
		}
		for _, d := range docs {
			byKind[d["kind"].(string)] = append(byKind[d["kind"].(string)], d)
		}
	}
	var atriumYAML string
	secretEnv := map[string]string{}
	for _, cm := range byKind["ConfigMap"] {
		atriumYAML, _ = dig(cm, "data", "atrium.yaml").(string)
	}
	for _, sec := range byKind["Secret"] {
		for k, v := range dig(sec, "stringData").(map[string]any) {
			secretEnv[k] = v.(string)
		}
	}
	if atriumYAML == "" || secretEnv["ATRIUM_AUTH_COOKIE_KEY"] == "" {
		t.Fatal("no atrium.yaml ConfigMap or no Secret with ATRIUM_AUTH_COOKIE_KEY")
	}
	// The Secret holds placeholders: validate with real-looking values.
	secretEnv["ATRIUM_AUTH_COOKIE_KEY"] = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
	cfgPath := filepath.Join(t.TempDir(), "atrium.yaml")
	if err := os.WriteFile(cfgPath, []byte(atriumYAML), 0o600); err != nil {
		t.Fatal(err)
	}

	workloads := map[string]map[string]any{}
	for _, kind := range []string{"Deployment", "StatefulSet"} {
		for _, w := range byKind[kind] {
			workloads[kind+"/"+dig(w, "metadata", "name").(string)] = w
		}
	}
	if len(workloads) != 2 {
		t.Fatalf("workloads %v, want the gateway Deployment and the node StatefulSet", len(workloads))
	}
	seenRoles := map[string]bool{}
	for name, w := range workloads {
		pod := dig(w, "spec", "template", "spec").(map[string]any)
		c := pod["containers"].([]any)[0].(map[string]any)
		if c["image"] != "atrium" {
			t.Errorf("%s: image %v, want atrium (kustomize maps it to the image built from deploy/Dockerfile)", name, c["image"])
		}
		if dig(c, "livenessProbe", "httpGet", "path") != "/healthz" || dig(c, "readinessProbe", "httpGet", "path") != "/readyz" {
			t.Errorf("%s: probes %v / %v, want /healthz and /readyz", name, c["livenessProbe"], c["readinessProbe"])
		}
		env := map[string]string{}
		maps.Copy(env, secretEnv)
		for _, e := range c["env"].([]any) {
			e := e.(map[string]any)
			if v, ok := e["value"].(string); ok {
				env[e["name"].(string)] = v
			} else if dig(e, "valueFrom", "fieldRef", "fieldPath") == "metadata.name" {
				env[e["name"].(string)] = "atrium-pod-0"
			}
		}
		f, err := config.Load(cfgPath, func(k string) string { return env[k] })
		if err != nil {
			t.Fatalf("%s: load atrium.yaml: %v", name, err)
		}
		if err := f.Validate(false); err != nil {
			t.Errorf("%s: atrium.yaml is not valid with its environment:\n%v", name, err)
		}
		if len(f.Roles) != 1 || f.Node.ID != "atrium-pod-0" {
			t.Errorf("%s: roles %v, node id %q: want one role and the pod's name", name, f.Roles, f.Node.ID)
			continue
		}
		seenRoles[f.Roles[0]] = true
		grace, _ := pod["terminationGracePeriodSeconds"].(int)
		if f.HasRole(config.RoleNode) && time.Duration(grace)*time.Second <= f.Node.DrainGrace+shutdownMargin/2 {
			t.Errorf("%s: terminationGracePeriodSeconds %d leaves no time after drain_grace %v", name, grace, f.Node.DrainGrace)
		}
		if f.HasRole(config.RoleNode) && len(dig(w, "spec", "volumeClaimTemplates").([]any)) == 0 {
			t.Errorf("%s: no volume claim for data_dir", name)
		}
	}
	if !seenRoles[config.RoleGateway] || !seenRoles[config.RoleNode] {
		t.Errorf("roles run: %v", seenRoles)
	}
	components := func(kind string) map[string]bool {
		out := map[string]bool{}
		for _, d := range byKind[kind] {
			if c, ok := dig(d, "spec", "selector", "matchLabels", "app.kubernetes.io/component").(string); ok {
				out[c] = true
			}
			if c, ok := dig(d, "spec", "selector", "app.kubernetes.io/component").(string); ok {
				out[c] = true
			}
		}
		return out
	}
	if pdb := components("PodDisruptionBudget"); !pdb["gateway"] || !pdb["node"] {
		t.Errorf("PodDisruptionBudgets cover %v, want gateway and node", pdb)
	}
	if svc := components("Service"); !svc["gateway"] {
		t.Errorf("Services select %v, want the gateway", svc)
	}
	if len(byKind["HorizontalPodAutoscaler"]) != 1 || len(byKind["Ingress"]) != 1 || len(byKind["NetworkPolicy"]) < 2 {
		t.Errorf("HPA %d, Ingress %d, NetworkPolicy %d", len(byKind["HorizontalPodAutoscaler"]), len(byKind["Ingress"]), len(byKind["NetworkPolicy"]))
	} else if to, _ := dig(byKind["Ingress"][0], "metadata", "annotations", "nginx.ingress.kubernetes.io/proxy-read-timeout").(string); atoi(to) < 3600 {
		t.Errorf("ingress read timeout %q: WebSockets need an hour or more", to)
	}
	if _, err := yamlDocs(filepath.Join(dir, "nats-values.yaml")); err != nil {
		t.Errorf("nats-values.yaml: %v", err)
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// dig walks nested maps by keys; nil if a key is missing.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func TestDeploy_ExampleConfigIsValid(t *testing.T) {
	f, err := config.Load(filepath.Join(deployDir, "atrium.yaml"), func(string) string { return "" })
	if err != nil {
		t.Fatalf("load deploy/atrium.yaml: %v", err)
	}
	if err := f.Validate(false); err != nil {
		t.Fatalf("deploy/atrium.yaml is not valid for atrium serve:\n%v", err)
	}
}

// pinned is an image reference with an explicit version tag (or digest).
var pinned = regexp.MustCompile(`^[a-z0-9./-]+(:v?[0-9][0-9A-Za-z.\-]*|@sha256:[0-9a-f]{64})$`)

func TestDeploy_ComposeImages(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(deployDir, "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Services map[string]struct {
			Image string `yaml:"image"`
			Build *struct {
				Context    string `yaml:"context"`
				Dockerfile string `yaml:"dockerfile"`
			} `yaml:"build"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Services) == 0 {
		t.Fatal("compose.yaml has no services")
	}
	for name, s := range c.Services {
		switch {
		case s.Build != nil:
			df := filepath.Join(deployDir, s.Build.Context, s.Build.Dockerfile)
			if filepath.Clean(df) != filepath.Clean(filepath.Join(deployDir, "Dockerfile")) {
				t.Errorf("service %s builds %s, not deploy/Dockerfile", name, df)
			}
		case !pinned.MatchString(s.Image):
			t.Errorf("service %s: image %q is neither built from deploy/Dockerfile nor pinned to a version", name, s.Image)
		}
	}
	// The Dockerfile's base images are pinned too.
	df, err := os.ReadFile(filepath.Join(deployDir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(df)))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "FROM" && !pinned.MatchString(f[1]) {
			t.Errorf("Dockerfile base image %q is not pinned", f[1])
		}
	}
}

var metricName = regexp.MustCompile(`\batrium_[a-z_]+`)

func TestDeploy_DashboardMetricsExist(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(deployDir, "grafana", "atrium.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("deploy/grafana/atrium.json: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := server.Start(ctx, server.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir()})
	if err != nil {
		t.Fatalf("start server: %v", err)
	}
	t.Cleanup(func() { srv.Close(context.Background()) })
	// The catalog gauges appear once the gateway's copy is complete.
	var have map[string]bool
	deadline := time.Now().Add(30 * time.Second)
	for {
		have = scrapeNames(t, srv.URL())
		if have["atrium_sessions"] || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // polling, bounded by deadline
	}
	have = scrapeNames(t, srv.URL()) // Now with the request counters of the scrapes before.
	n := 0
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, m := range metricName.FindAllString(tg.Expr, -1) {
				n++
				base := m
				for _, suf := range []string{"_bucket", "_count", "_sum"} {
					base = strings.TrimSuffix(base, suf)
				}
				if !have[m] && !have[base] {
					t.Errorf("panel %q uses %s, which the server does not export", p.Title, m)
				}
			}
		}
	}
	if n < 10 {
		t.Errorf("the dashboard uses only %d atrium metrics", n)
	}
}

// scrapeNames returns the metric families of a /metrics scrape.
func scrapeNames(t *testing.T, base string) map[string]bool {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
			out[f[2]] = true
		}
	}
	return out
}

// TestDeploy_ComposeClusterIsValid: the compose file's cluster services run
// deploy/atrium.yaml (baked into the image) with their environment: each is
// valid, and they form 1 gateway and 2 nodes with distinct ids.
func TestDeploy_ComposeClusterIsValid(t *testing.T) {
	docs, err := yamlDocs(filepath.Join(deployDir, "compose.yaml"))
	if err != nil || len(docs) != 1 {
		t.Fatalf("compose.yaml: %v", err)
	}
	roles, ids := map[string]int{}, map[string]bool{}
	for name, svc := range docs[0]["services"].(map[string]any) {
		envMap, _ := dig(svc, "environment").(map[string]any)
		if envMap["ATRIUM_ROLES"] == nil {
			continue
		}
		env := map[string]string{"ATRIUM_STORAGE_S3_SECRET_KEY": "from-atrium.env"}
		for k, v := range envMap {
			env[k] = fmt.Sprint(v)
		}
		f, err := config.Load(filepath.Join(deployDir, "atrium.yaml"), func(k string) string { return env[k] })
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := f.Validate(false); err != nil {
			t.Errorf("service %s: deploy/atrium.yaml with its environment is not valid:\n%v", name, err)
		}
		roles[strings.Join(f.Roles, ",")]++
		if ids[f.Node.ID] {
			t.Errorf("service %s: node id %s is taken", name, f.Node.ID)
		}
		ids[f.Node.ID] = true
	}
	if roles["gateway"] != 1 || roles["node"] != 2 {
		t.Errorf("compose cluster roles %v, want 1 gateway and 2 nodes", roles)
	}
}
