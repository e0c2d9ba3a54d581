package vmhost_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/compute/modelgw"
	"github.com/atriumhq/atrium/compute/modelgw/modeltest"
	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/compute/vmhost"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

// serveText serves body over HTTP on host:0 until the test ends and
// returns its host:port.
func serveText(t *testing.T, host, body string) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, body) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// hostAddress is an IPv4 address of this machine that is not loopback.
func hostAddress(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	t.Fatal("this machine has no IPv4 address besides loopback")
	return ""
}

// TestNetwork_OnlyNodeAndAllowed: a VM reaches the VM host only through
// the ports forwarded in and its outbound proxy, which lets through the
// allowed destinations (the object store, an allowed host) and nothing
// else. From inside a VM (a sandbox with the VM's network), loopback
// services of the VM host that are not allowed cannot be reached, neither
// directly (10.0.2.2 is the host's loopback under QEMU's unrestricted user
// network) nor through the proxy; the allowed paths work: exec, workspace
// save and restore through presigned URLs, the model tunnel, a sandbox's
// egress allowlist.
func TestNetwork_OnlyNodeAndAllowed(t *testing.T) {
	s3 := blobtest.StartS3(t)
	store := s3.Open(t, "")
	secret := serveText(t, "127.0.0.1", "SECRET-LOOPBACK")
	allowedLoop := serveText(t, "127.0.0.1", "ALLOWED-LOOPBACK")
	hostIP := hostAddress(t)
	allowedHost := serveText(t, hostIP, "ALLOWED-EGRESS")
	deniedHost := serveText(t, hostIP, "DENIED-EGRESS")
	_, url := newServer(t, vmhost.Config{Allow: []string{s3.Endpoint, allowedLoop, allowedHost}})
	hook := &remote.HTTPHook{URL: url, Header: http.Header{"Authorization": {"Bearer " + hostToken}}}
	p, err := remote.New(remote.Config{Hook: hook, StartTimeout: 90 * time.Second, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p.Close(ctx)
	})
	ctx := context.Background()
	port := func(hp string) string { _, pt, _ := net.SplitHostPort(hp); return pt }

	// A sandbox with the VM's own network.
	id := session.NewID()
	sb := computetest.Open(t, p, compute.Spec{Session: id, Fence: 1, Network: true}).(*remote.Sandbox)
	probe := func(name, script string) computetest.Result {
		t.Helper()
		r := computetest.Finish(t, computetest.Start(t, sb, compute.ExecRequest{Argv: []string{"sh", "-c", script}}), "")
		t.Logf("%s: exit %+v, stdout %q, stderr %q", name, r.Exit, r.Stdout, r.Stderr)
		return r
	}
	// The control: the proxy's path works, so the refusals below are the
	// network's, not the probe's.
	if r := probe("allowed through the proxy", viaProxy(guestProxy, allowedLoop)); !strings.Contains(r.Stdout, "ALLOWED-LOOPBACK") {
		t.Fatalf("an allowed loopback service through the proxy: exit %d, %q %q", r.Exit.Code, r.Stdout, r.Stderr)
	}
	for _, c := range []struct {
		name, script string
		proxied      bool // the proxy answers: a 403
	}{
		{"loopback service directly", direct("10.0.2.2:" + port(secret)), false},
		{"allowed loopback service directly", direct("10.0.2.2:" + port(allowedLoop)), false},
		{"object store directly", direct("10.0.2.2:" + port(s3.Endpoint)), false},
		{"host address directly", direct(allowedHost), false},
		{"loopback service through the proxy", viaProxy(guestProxy, secret), true},
		{"unlisted host through the proxy", viaProxy(guestProxy, deniedHost), true},
	} {
		r := probe(c.name, c.script)
		if strings.Contains(r.Stdout, "SECRET") || strings.Contains(r.Stdout, "ALLOWED") || strings.Contains(r.Stdout, "DENIED") {
			t.Errorf("%s: reached (exit %d, stdout %q)", c.name, r.Exit.Code, r.Stdout)
		} else if c.proxied && !strings.Contains(r.Stdout, " 403 Forbidden") {
			t.Errorf("%s: exit %d, stdout %q, want the proxy's 403", c.name, r.Exit.Code, r.Stdout)
		} else if !c.proxied && r.Exit.Code == 0 {
			t.Errorf("%s: connected (exit 0, stdout %q)", c.name, r.Stdout)
		}
	}

	// Workspace save and restore through presigned URLs.
	vol := &mount.Volume{Blob: store, Prefix: mount.Prefix(id), Logger: testLogger(t)}
	if _, err := vol.Restore(ctx, sb.Workspace(), 1); err != nil {
		t.Fatalf("first restore: %v", err)
	}
	computetest.ShOK(t, sb, "echo kept-through-the-store > /workspace/note && head -c 200000 /dev/urandom > /workspace/blob")
	want := computetest.ShOK(t, sb, "cd /workspace && sha256sum note blob")
	if st, err := vol.Save(ctx, sb.Workspace(), 1); err != nil {
		t.Fatalf("save: %v", err)
	} else if st.ObjectsWritten == 0 {
		t.Fatalf("save uploaded nothing: %+v", st)
	}

	// Another VM: the workspace restored from the store, the model
	// tunnel, an egress allowlist through the VM host's proxy.
	up := modeltest.New(t)
	up.SetDefault(modeltest.Text("hello from the model"))
	gw, err := modelgw.New(modelgw.Config{Providers: []modelgw.Provider{
		{Name: "anthropic", Kind: modelgw.KindAnthropic, BaseURL: up.URL, APIKey: "sk-ant-test"}}})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "model.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	gsrv := &http.Server{Handler: gw}
	go gsrv.Serve(ln)
	t.Cleanup(func() { gsrv.Close() })
	id2 := session.NewID()
	sb2 := computetest.Open(t, p, compute.Spec{Session: id2, Fence: 1, ModelSocket: sock, Egress: []string{allowedHost, deniedHost}}).(*remote.Sandbox)
	if _, err := vol.Restore(ctx, sb2.Workspace(), 1); err != nil {
		t.Fatalf("restore into another VM: %v", err)
	}
	if got := computetest.ShOK(t, sb2, "cd /workspace && sha256sum note blob"); got != want {
		t.Fatalf("restored workspace %q, want %q", got, want)
	}
	tok := gw.Issue("s1", "")
	if err := gw.Activate(tok, 1, "ann"); err != nil {
		t.Fatal(err)
	}
	env := []string{"ANTHROPIC_BASE_URL=" + gw.Endpoints().Anthropic, "ANTHROPIC_API_KEY=" + tok}
	r := computetest.Finish(t, computetest.Start(t, sb2, compute.ExecRequest{Argv: []string{"bash", "-c", askModel}, Env: env}), "")
	if !strings.Contains(r.Stdout, "HTTP/1.1 200") || !strings.Contains(r.Stdout, `"text":"hello from the model"`) {
		t.Fatalf("the model through the tunnel: %q (stderr %q)", r.Stdout, r.Stderr)
	}
	// The sandbox's allowlist names both; the VM host allows only one.
	r = computetest.Finish(t, computetest.Start(t, sb2, compute.ExecRequest{Argv: []string{"sh", "-c", viaProxy("127.0.0.1:3128", allowedHost)}}), "")
	if !strings.Contains(r.Stdout, "ALLOWED-EGRESS") {
		t.Fatalf("egress to a host both allow: exit %d, %q %q", r.Exit.Code, r.Stdout, r.Stderr)
	}
	r = computetest.Finish(t, computetest.Start(t, sb2, compute.ExecRequest{Argv: []string{"sh", "-c", viaProxy("127.0.0.1:3128", deniedHost)}}), "")
	// The guest's egress proxy lets it through; the VM host's refuses it.
	if strings.Contains(r.Stdout, "DENIED-EGRESS") || !strings.Contains(r.Stdout, "upstream proxy refused "+deniedHost+": 403 Forbidden") {
		t.Fatalf("egress to a host the VM host does not allow: exit %d, %q", r.Exit.Code, r.Stdout)
	}
}

// guestProxy is the VM host's outbound proxy as the guest sees it.
const guestProxy = "10.0.2.100:3128"

// direct is a script that GETs http://hostport/ over bash's /dev/tcp (the
// guest's busybox wget crashes in its static resolver), giving up after
// 8 s: it fails unless the guest can connect to hostport.
func direct(hostport string) string {
	h, p, _ := net.SplitHostPort(hostport)
	return fmt.Sprintf(`timeout 8 bash -c 'exec 3<>/dev/tcp/%s/%s || exit 7; printf "GET / HTTP/1.0\r\nHost: %s\r\n\r\n" >&3; cat <&3'`, h, p, hostport)
}

// viaProxy is a script that GETs http://dest/ through the HTTP proxy at
// proxy (absolute-form) and prints the answer.
func viaProxy(proxy, dest string) string {
	h, p, _ := net.SplitHostPort(proxy)
	return fmt.Sprintf(`timeout 15 bash -c 'exec 3<>/dev/tcp/%s/%s || exit 7; printf "GET http://%s/ HTTP/1.0\r\nHost: %s\r\n\r\n" >&3; cat <&3'`, h, p, dest, dest)
}

// askModel posts a Messages request to $ANTHROPIC_BASE_URL with the key in
// $ANTHROPIC_API_KEY over bash's /dev/tcp and prints the answer.
const askModel = `u=${ANTHROPIC_BASE_URL#http://}; hp=${u%%/*}; path=/${u#*/}
body='{"model":"claude-x","max_tokens":10,"messages":[]}'
exec 3<>/dev/tcp/${hp%:*}/${hp##*:} || exit 9
printf 'POST %s/v1/messages HTTP/1.1\r\nHost: %s\r\nx-api-key: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
  "$path" "$hp" "$ANTHROPIC_API_KEY" "${#body}" "$body" >&3
cat <&3`
