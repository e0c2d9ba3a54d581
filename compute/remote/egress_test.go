package remote_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/compute/remote"
)

// httpGet fetches the http:// URL $1 through the proxy HTTP_PROXY names and
// prints the status code and the body (bash only: nothing else is sure to
// be in a sandbox).
const httpGet = `u=${1#http://}; h=${u%%/*}; p=${HTTP_PROXY#http://}
[ -n "$p" ] || { echo noproxy; exit 0; }
exec 3<>/dev/tcp/${p%:*}/${p##*:} || exit 9
printf 'GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' "$1" "$h" >&3
IFS=' ' read -r _ code _ <&3
while IFS= read -r line <&3 && [ "$line" != $'\r' ]; do :; done
echo "$code"; cat <&3`

// TestSandbox_Egress: a VM sandbox's egress allowlist is applied by its
// agent: listed hosts are reached through the proxy, others are refused,
// and a sandbox without one has no proxy at all.
func TestSandbox_Egress(t *testing.T) {
	dest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from "+r.Host)
	}))
	t.Cleanup(dest.Close)
	hook := newInProcessHook(t, false)
	hook.egressDial = func(ctx context.Context, network, address string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(address)
		if err != nil || !strings.HasSuffix(host, ".test") {
			return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("not a test host")}
		}
		var d net.Dialer
		return d.DialContext(ctx, network, dest.Listener.Addr().String())
	}
	p := newProvider(t, newRecorder(t, hook), remote.Config{})
	get := func(sb compute.Sandbox, url string) string {
		t.Helper()
		r := computetest.Finish(t, computetest.Start(t, sb, compute.ExecRequest{Argv: []string{"bash", "-c", httpGet, "get", url}}), "")
		return strings.TrimSpace(r.Stdout)
	}
	sb := computetest.Open(t, p, compute.Spec{Egress: []string{"allowed.test"}})
	if got := get(sb, "http://allowed.test/x"); !strings.HasPrefix(got, "200") || !strings.Contains(got, "hello from allowed.test") {
		t.Errorf("allowed host: %q", got)
	}
	if got := get(sb, "http://denied.test/x"); !strings.HasPrefix(got, "403") {
		t.Errorf("host not on the allowlist: %q; want 403 from the proxy", got)
	}
	none := computetest.Open(t, p, compute.Spec{})
	if got := get(none, "http://allowed.test/x"); got != "noproxy" {
		t.Errorf("sandbox without an allowlist: %q; want no proxy", got)
	}
}
