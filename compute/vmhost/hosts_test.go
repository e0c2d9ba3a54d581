package vmhost_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/compute/vmhost"
	"github.com/atriumhq/atrium/session"
)

// newHost starts a VM host on loopback like newServer, and returns its
// HTTP server too, so that a test can kill the host.
func newHost(t *testing.T, cfg vmhost.Config) (*vmhost.Server, *httptest.Server) {
	t.Helper()
	cfg.Dir = testImage(t)
	cfg.StateDir = stateDir(t)
	cfg.Token = hostToken
	cfg.Version = imageVersion
	cfg.Logger = testLogger(t)
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	srv, err := vmhost.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		srv.Close()
	})
	return srv, hs
}

// vmOf returns the VM of session id on srv, if it has one.
func vmOf(srv *vmhost.Server, id session.ID) (vmhost.VMStatus, bool) {
	for _, v := range srv.Status().VMs {
		if v.Session == string(id) {
			return v, true
		}
	}
	return vmhost.VMStatus{}, false
}

// guestSkew is how far the guest's clock is off the host's.
func guestSkew(t *testing.T, sb compute.Sandbox) time.Duration {
	t.Helper()
	out := strings.TrimSpace(computetest.ShOK(t, sb, "date +%s"))
	var secs int64
	if _, err := fmt.Sscan(out, &secs); err != nil {
		t.Fatalf("date +%%s: %q", out)
	}
	return time.Since(time.Unix(secs, 0)).Abs()
}

// TestVMHosts runs sandboxes on two VM hosts of one VM each, as a node
// configured with both does: placement by free capacity, refusal when both
// are full, sleep that keeps a running command (the VM saved to the host's
// disk and restored with the kernel, the workspace and the host's time),
// and a dead host's sandbox recreated on the other.
func TestVMHosts(t *testing.T) {
	srvA, hsA := newHost(t, vmhost.Config{MaxVMs: 1, MemoryMiB: 384})
	srvB, hsB := newHost(t, vmhost.Config{MaxVMs: 1, MemoryMiB: 384})
	hosts := &remote.VMHosts{Hosts: []remote.VMHost{{URL: hsA.URL, Token: hostToken}, {URL: hsB.URL, Token: hostToken}}, Logger: testLogger(t)}
	p, err := remote.New(remote.Config{Hook: hosts, StartTimeout: 90 * time.Second, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p.Close(ctx)
	})
	ctx := context.Background()

	// Placement: the first sandbox on A (both free, A first), the second
	// on B (A is full), a third nowhere.
	s1 := computetest.Open(t, p, compute.Spec{})
	s1ID := session.ID("")
	for _, v := range srvA.Status().VMs {
		s1ID = session.ID(v.Session)
	}
	if s1ID == "" {
		t.Fatalf("the first sandbox is not on host A: A %+v, B %+v", srvA.Status().VMs, srvB.Status().VMs)
	}
	s2ID := session.NewID()
	s2 := computetest.Open(t, p, compute.Spec{Session: s2ID})
	if _, ok := vmOf(srvB, s2ID); !ok {
		t.Fatalf("the second sandbox is not on host B: %+v", srvB.Status().VMs)
	}
	_, err = p.Open(ctx, compute.Spec{Session: session.NewID()})
	if !errors.Is(err, session.ErrUnavailable) || !strings.Contains(err.Error(), "full") {
		t.Fatalf("a third sandbox with both hosts full: %v; want unavailable naming full hosts", err)
	}

	// Sleep keeps a running command: the VM is saved to A's disk and
	// stopped, and the command carries on after the wake.
	computetest.ShOK(t, s1, "echo kept >/workspace/note")
	pr, err := s1.Exec(ctx, compute.ExecRequest{Argv: []string{"/bin/sh", "-c", `i=0; while read line; do i=$((i+1)); echo "$i $line"; done`}})
	if err != nil {
		t.Fatal(err)
	}
	out := bufio.NewReader(pr.Stdout())
	say := func(line, want string) {
		t.Helper()
		if _, err := io.WriteString(pr.Stdin(), line+"\n"); err != nil {
			t.Fatalf("write %q: %v", line, err)
		}
		got, err := out.ReadString('\n')
		if err != nil || got != want+"\n" {
			t.Fatalf("after %q: read %q, %v; want %q", line, got, err, want)
		}
	}
	say("a", "1 a")
	if d := guestSkew(t, s1); d > 3*time.Second {
		t.Fatalf("the clone's clock is %v off the host's", d)
	}
	upBefore := guestUptime(t, s1)
	if err := s1.Sleep(ctx); err != nil {
		t.Fatalf("sleep: %v", err)
	}
	if v, _ := vmOf(srvA, s1ID); v.State != "sleeping" || v.RSSBytes != 0 {
		t.Fatalf("VM after sleep: %+v; want sleeping, no process", v)
	}
	// Time passes while the VM sleeps: its clock stands still, and the
	// wake sets it.
	time.Sleep(3 * time.Second)
	start := time.Now()
	if got := strings.TrimSpace(computetest.ShOK(t, s1, "cat /workspace/note")); got != "kept" {
		t.Fatalf("after wake /workspace/note holds %q", got)
	}
	t.Logf("wake and a command: %v", time.Since(start).Round(time.Millisecond))
	say("b", "2 b") // The same process: its count went on.
	if v, _ := vmOf(srvA, s1ID); v.State != "running" {
		t.Fatalf("VM after wake: %+v", v)
	}
	// The same kernel runs on (its uptime went on, the seconds asleep not
	// counted), with the host's time.
	if up := guestUptime(t, s1); up < upBefore || up > upBefore+5 {
		t.Fatalf("the guest's uptime went from %.1fs to %.1fs over a sleep", upBefore, up)
	}
	if d := guestSkew(t, s1); d > 3*time.Second {
		t.Fatalf("after wake the guest's clock is %v off the host's", d)
	}

	// Host A dies. B makes room; the next command of the first sandbox
	// gets a fresh VM there, and the command that ran on A is lost.
	hsA.CloseClientConnections()
	hsA.Close()
	srvA.Close()
	if err := s2.Destroy(ctx); err != nil {
		t.Fatalf("destroy the second sandbox: %v", err)
	}
	r := computetest.Sh(t, s1, "test -e /workspace/note && echo old || echo fresh")
	if r.Exit.Code != 0 || strings.TrimSpace(r.Stdout) != "fresh" {
		t.Fatalf("after host A died: %+v %q", r.Exit, r.Stdout)
	}
	if _, ok := vmOf(srvB, s1ID); !ok {
		t.Fatalf("the first sandbox's new VM is not on host B: %+v", srvB.Status().VMs)
	}
	done := make(chan compute.Exit, 1)
	go func() { e, _ := pr.Wait(); done <- e }()
	select {
	case e := <-done:
		if !e.Lost {
			t.Errorf("the command of the dead host ended %+v; want lost", e)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the command of the dead host never ended")
	}
}
