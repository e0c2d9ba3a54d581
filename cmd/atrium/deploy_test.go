package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/atriumhq/atrium/cmd/atrium/internal/config"
	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
)

const deployDir = "../../deploy"

func TestDeploy_YAMLParses(t *testing.T) {
	for _, name := range []string{"compose.yaml", "atrium.yaml"} {
		b, err := os.ReadFile(filepath.Join(deployDir, name))
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		if err := yaml.Unmarshal(b, &v); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
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
