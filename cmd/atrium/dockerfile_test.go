package main

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDeploy_DockerfileBuildsAStaticBinary runs the Dockerfile's build step
// (its `RUN CGO_ENABLED=0 go build …` line, as written) on this machine and
// checks that the result is a static executable that runs: no Docker engine
// is needed to know the image's one binary works on any base.
func TestDeploy_DockerfileBuildsAStaticBinary(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(deployDir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^RUN (CGO_ENABLED=0 go build .* -o )/out/atrium (\./cmd/atrium)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("the Dockerfile has no `RUN CGO_ENABLED=0 go build … -o /out/atrium ./cmd/atrium` step")
	}
	out := filepath.Join(t.TempDir(), "atrium")
	cmd := exec.Command("sh", "-c", string(m[1])+out+" "+string(m[2]))
	cmd.Dir = "../.."
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Dockerfile's build step failed: %v\n%s", err, msg)
	}
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("the binary asks for a dynamic loader: it is not static")
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("the binary links %v (%v): it is not static", libs, err)
	}
	ver, err := exec.Command(out, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(ver), "atrium") {
		t.Errorf("the built binary does not run: %v\n%s", err, ver)
	}
}
