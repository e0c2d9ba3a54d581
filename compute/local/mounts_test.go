package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/session"
)

func TestSandbox_Mounts(t *testing.T) {
	prog, home := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(prog, "hello"), []byte("#!/bin/sh\necho hello from $0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	mounts := []compute.Mount{
		{Host: prog, Sandbox: "/opt/atrium/agents/x", ReadOnly: true},
		{Host: home, Sandbox: "/home/atrium"},
	}
	p := newTestProvider(t, Config{})
	sb := computetest.Open(t, p, compute.Spec{Mounts: mounts})

	if got := computetest.ShOK(t, sb, "/opt/atrium/agents/x/hello"); got != "hello from /opt/atrium/agents/x/hello\n" {
		t.Errorf("the read-only mount's program printed %q", got)
	}
	if r := computetest.Sh(t, sb, "echo x > /opt/atrium/agents/x/new"); r.Exit.Code == 0 {
		t.Error("a read-only mount accepted a write")
	}
	if _, err := os.Stat(filepath.Join(prog, "new")); err == nil {
		t.Error("a write to a read-only mount reached the host")
	}
	// The command's own HOME wins over the sandbox's, and a read-write
	// mount's writes reach the host.
	r := computetest.Finish(t, computetest.Start(t, sb, compute.ExecRequest{
		Argv: []string{"sh", "-c", `mkdir -p "$HOME/.cfg" && echo kept > "$HOME/.cfg/f" && echo "$HOME"`},
		Env:  []string{"HOME=/home/atrium"},
	}), "")
	if r.Exit.Code != 0 || r.Stdout != "/home/atrium\n" {
		t.Fatalf("writing the home: exit %+v, stdout %q, stderr %q", r.Exit, r.Stdout, r.Stderr)
	}
	if b, err := os.ReadFile(filepath.Join(home, ".cfg", "f")); err != nil || string(b) != "kept\n" {
		t.Errorf("the host home holds %q, %v", b, err)
	}

	// Opening again without the mounts removes them from later commands.
	sb = computetest.Open(t, p, compute.Spec{Session: sb.(*Sandbox).m.id, Fence: 1})
	if got := computetest.ShOK(t, sb, "test -e /opt/atrium/agents/x/hello && echo present || echo absent"); got != "absent\n" {
		t.Errorf("after an Open without mounts, the mount is %s", strings.TrimSpace(got))
	}
}

func TestSandbox_BadMounts(t *testing.T) {
	dir := t.TempDir()
	p := newTestProvider(t, Config{})
	for name, m := range map[string]compute.Mount{
		"relative host":     {Host: "rel", Sandbox: "/opt/x"},
		"missing host":      {Host: filepath.Join(dir, "nope"), Sandbox: "/opt/x"},
		"root":              {Host: dir, Sandbox: "/"},
		"relative sandbox":  {Host: dir, Sandbox: "opt/x"},
		"in the workspace":  {Host: dir, Sandbox: "/workspace/x"},
		"over the system":   {Host: dir, Sandbox: "/usr/local"},
		"workspace exactly": {Host: dir, Sandbox: "/workspace"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := p.Open(context.Background(), compute.Spec{Session: session.NewID(), Mounts: []compute.Mount{m}})
			if !errors.Is(err, session.ErrBadRequest) {
				t.Errorf("Open with mount %+v: %v, want a bad request", m, err)
			}
		})
	}
}

func TestUnsafeMountPaths(t *testing.T) {
	mounts := []compute.Mount{{Host: "/data/agents/x/1", Sandbox: "/opt/atrium/agents/x"}, {Host: "/data/homes/s", Sandbox: "/home/atrium"}}
	got := unsafeMountPaths(mounts, []string{"/opt/atrium/agents/x/bin/a", "--flag", "HOME=/home/atrium", "X=/home/atriumother", "/home/atrium"})
	want := []string{"/data/agents/x/1/bin/a", "--flag", "HOME=/data/homes/s", "X=/home/atriumother", "/data/homes/s"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestLastWins(t *testing.T) {
	got := lastWins([]string{"PATH=/bin", "HOME=/workspace", "A=1", "HOME=/home/atrium"})
	if want := "PATH=/bin A=1 HOME=/home/atrium"; strings.Join(got, " ") != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
