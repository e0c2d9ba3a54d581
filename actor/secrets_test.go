package actor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/storage/blob"

	"github.com/atriumhq/atrium/compute/local"
	"github.com/atriumhq/atrium/session"
)

// logBuffer collects every log line of a host and its provider, at debug
// level, so that tests can check what never reaches them.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// withCapturedLogs sends the host's and a fresh local provider's logs to
// logs; dial, if set, is the provider's EgressDial.
func withCapturedLogs(t testing.TB, logs *logBuffer, dial func(ctx context.Context, network, address string) (net.Conn, error)) envOption {
	p, err := local.New(local.Config{Dir: t.TempDir(), Bwrap: "/usr/bin/bwrap", EgressDial: dial, Logger: logs.logger()})
	if err != nil {
		t.Fatalf("local compute (run .ci/deps if bubblewrap is missing): %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			t.Errorf("close local compute: %v", err)
		}
	})
	return func(c *Config) {
		c.Provider = p
		c.Logger = logs.logger()
	}
}

func wantCode(t testing.TB, what string, rep session.Reply, code session.Code, sub string) {
	t.Helper()
	if rep.Error == nil || rep.Error.Code != code || !strings.Contains(rep.Error.Message, sub) {
		t.Errorf("%s: reply %+v, want %s containing %q", what, rep.Error, code, sub)
	}
}

// TestHost_Secrets: an owner's secrets reach the harness environment of
// every turn, and their values never reach an event, the catalog, a reply
// or a log.
func TestHost_Secrets(t *testing.T) {
	logs := &logBuffer{}
	checkpoints := t.TempDir()
	e := newEnv(t, withCapturedLogs(t, logs, nil), func(c *Config) { c.Checkpoints = &blob.Dir{Path: checkpoints} })
	const value = "s3cr3t-VALUE-7f1d2c"
	sum := sha256.Sum256([]byte(value))
	// The harness proves it sees the value without printing it.
	id := e.create("alice", command("bash", "-c",
		`read -r _; printf 'sum=%s\n' "$(printf %s "$GH_TOKEN" | sha256sum | cut -d' ' -f1)"; echo "other=${OTHER-unset}"`))
	w := e.watch(id)
	e.cmd(id, "alice", session.Command{Op: session.OpMember, User: "bob", Role: session.RoleDriver})
	e.cmd(id, "alice", session.Command{Op: session.OpMember, User: "carol", Role: session.RoleViewer})

	t.Run("owner only", func(t *testing.T) {
		for _, u := range []string{"bob", "carol", "mallory"} {
			for _, op := range []session.Op{session.OpSecretSet, session.OpSecretDelete, session.OpSecrets} {
				rep := e.cmd(id, u, session.Command{Op: op, Name: "GH_TOKEN", Value: "x"})
				if rep.Error == nil || (rep.Error.Code != session.CodeForbidden && rep.Error.Code != session.CodeNotFound) {
					t.Errorf("%s by %s: %+v, want forbidden", op, u, rep.Error)
				}
			}
		}
	})
	t.Run("bad names and sizes", func(t *testing.T) {
		for _, name := range []string{"", "1ABC", "A-B", "ATRIUM_SESSION", "atrium_x", "PATH", "HOME", "HTTP_PROXY", "LD_PRELOAD", "A B"} {
			rep := e.cmd(id, "alice", session.Command{Op: session.OpSecretSet, Name: name, Value: "x"})
			wantCode(t, "name "+name, rep, session.CodeBadRequest, "")
		}
		rep := e.cmd(id, "alice", session.Command{Op: session.OpSecretSet, Name: "BIG", Value: strings.Repeat("x", session.MaxSecretBytes+1)})
		wantCode(t, "too big", rep, session.CodePayloadTooLarge, "at most")
		rep = e.cmd(id, "alice", session.Command{Op: session.OpSecretDelete, Name: "NOPE"})
		wantCode(t, "delete unset", rep, session.CodeNotFound, "NOPE")
	})

	if rep := e.cmd(id, "alice", session.Command{Op: session.OpSecretSet, Name: "GH_TOKEN", Value: value}); rep.Error != nil {
		t.Fatalf("set: %v", rep.Error)
	}
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpSecretSet, Name: "OTHER", Value: "o"}); rep.Error != nil {
		t.Fatalf("set: %v", rep.Error)
	}
	rep := e.cmd(id, "alice", session.Command{Op: session.OpSecrets})
	if len(rep.Secrets) != 2 || rep.Secrets[0].Name != "GH_TOKEN" || rep.Secrets[0].UpdatedBy != "alice" || rep.Secrets[0].UpdatedAt.IsZero() {
		t.Errorf("secrets = %+v (%+v)", rep.Secrets, rep)
	}
	e.prompt(id, "bob", "go")
	w.until("turn_finished", finished(1))
	if got, want := outputText(t, w.evs, 1, "stdout"), "sum="+hex.EncodeToString(sum[:])+"\nother=o\n"; got != want {
		t.Errorf("turn 1 stdout = %q, want %q", got, want)
	}
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpSecretDelete, Name: "OTHER"}); rep.Error != nil {
		t.Fatalf("delete: %v", rep.Error)
	}
	e.prompt(id, "bob", "again")
	w.until("turn_finished", finished(2))
	if got := outputText(t, w.evs, 2, "stdout"); !strings.HasSuffix(got, "other=unset\n") {
		t.Errorf("turn 2 stdout = %q, want OTHER unset", got)
	}

	// Nowhere but the harness environment.
	var seen []string
	for _, raw := range e.history(id, "alice") {
		seen = append(seen, string(raw))
	}
	for _, raw := range w.raw {
		seen = append(seen, string(raw))
	}
	cat, _ := e.kv.Get(context.Background(), string(id))
	seen = append(seen, string(cat.Value()))
	for _, op := range []session.Op{session.OpInfo, session.OpSecrets} {
		resp, err := e.request(e.subj.Cmd(id), "alice", session.Command{Op: op}, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, string(resp.Data))
	}
	seen = append(seen, logs.String())
	for i, s := range seen {
		if strings.Contains(s, value) {
			t.Errorf("the secret's value appears in output %d: %.300s", i, s)
		}
	}
	if !strings.Contains(logs.String(), "level=") {
		t.Errorf("no logs captured")
	}

	t.Run("survives hibernation", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := e.host.Close(ctx); err != nil {
			t.Fatal(err)
		}
		e.start()
		e.prompt(id, "alice", "after restart")
		w.until("turn_finished", finished(3))
		if got := outputText(t, w.evs, 3, "stdout"); !strings.HasPrefix(got, "sum="+hex.EncodeToString(sum[:])+"\n") {
			t.Errorf("turn 3 stdout = %q", got)
		}
	})

	// Issue 20 finding 3: at rest the value is only ciphertext, in the
	// history database and its WAL, the JetStream stream files (the
	// metadata capture) and the checkpoint objects.
	t.Run("encrypted at rest", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := e.host.Close(ctx); err != nil { // a checkpoint is written at hibernation
			t.Fatal(err)
		}
		n := 0
		for _, dir := range []string{e.dir.Path, e.ns.StoreDir(), checkpoints} {
			n += grepTree(t, dir, value)
		}
		if n < 3 {
			t.Errorf("only %d files searched: the test does not see the stores", n)
		}
		e.start()
	})
}

// grepTree fails t if any file under dir contains s, and returns how many
// files it read.
func grepTree(t *testing.T, dir, s string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		n++
		if bytes.Contains(b, []byte(s)) {
			t.Errorf("the secret's value is in clear in %s", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// testSecretKeys is the secrets keyring of every test host.
var testSecretKeys = func() *session.SecretKeyring {
	k, err := session.ParseSecretKeyring(session.NewSecretKeyLine("test"))
	if err != nil {
		panic(err)
	}
	return k
}()

func TestSecretKeyring(t *testing.T) {
	old := session.NewSecretKeyLine("old")
	cur := session.NewSecretKeyLine("new")
	before, _ := session.ParseSecretKeyring(old)
	// A value long enough that base64 ciphertext cannot contain it by chance
	// (a two-letter value did, about once in a hundred runs).
	const value = "ghp_v1-plaintext-secret-value"
	sealed := session.Secret{Sealed: before.Seal("GH_TOKEN", value)}
	if strings.Contains(sealed.Sealed, value) || !strings.HasPrefix(sealed.Sealed, "old:") {
		t.Fatalf("sealed %q", sealed.Sealed)
	}
	rotated, err := session.ParseSecretKeyring("# rotated\n" + cur + "\n\n" + old + "\n")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := rotated.Open("GH_TOKEN", sealed); err != nil || v != value {
		t.Fatalf("old secret after rotation: %q %v", v, err)
	}
	if s := rotated.Seal("X", "y"); !strings.HasPrefix(s, "new:") {
		t.Fatalf("rotated keyring seals with %q", s)
	}
	if _, err := rotated.Open("OTHER_NAME", sealed); err == nil {
		t.Fatal("a sealed value opens under another name")
	}
	dropped, _ := session.ParseSecretKeyring(cur)
	if _, err := dropped.Open("GH_TOKEN", sealed); err == nil || !strings.Contains(err.Error(), "key old") {
		t.Fatalf("dropped key: %v", err)
	}
	if v, err := (*session.SecretKeyring)(nil).Open("A", session.Secret{Value: "clear"}); err != nil || v != "clear" {
		t.Fatalf("secret stored in clear: %q %v", v, err)
	}
	for _, bad := range []string{"", "# nothing", "k:short", "k", "bad id:" + strings.Repeat("A", 44), old + "\n" + old} {
		if _, err := session.ParseSecretKeyring(bad); err == nil {
			t.Errorf("keyring %q accepted", bad)
		} else if strings.Contains(err.Error(), strings.TrimPrefix(old, "old:")) {
			t.Errorf("error shows a key: %v", err)
		}
	}
}

// httpGetScript fetches the http:// URL $1 through HTTP_PROXY with bash's
// /dev/tcp and prints the status code and body.
const httpGetScript = `u=${1#http://}; h=${u%%/*}; p=${HTTP_PROXY#http://}
[ -n "$p" ] || { echo noproxy; exit 0; }
exec 3<>/dev/tcp/${p%:*}/${p##*:} || exit 9
printf 'GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' "$1" "$h" >&3
IFS=' ' read -r _ code _ <&3
while IFS= read -r line <&3 && [ "$line" != $'\r' ]; do :; done
echo "$code"; cat <&3; echo`

// TestHost_Egress: a session's own egress entries must be covered by the
// node's permit list, and reach its sandbox.
func TestHost_Egress(t *testing.T) {
	dest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from "+r.Host)
	}))
	t.Cleanup(dest.Close)
	dial := func(ctx context.Context, network, address string) (net.Conn, error) {
		host, _, _ := net.SplitHostPort(address)
		if !strings.HasSuffix(host, ".test") {
			return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("not a test host")}
		}
		var d net.Dialer
		return d.DialContext(ctx, network, dest.Listener.Addr().String())
	}
	logs := &logBuffer{}
	e := newEnv(t, withCapturedLogs(t, logs, dial), func(c *Config) {
		c.EgressPermit = []string{"*.allowed.test", "fixed.test:8080"}
		c.SandboxSpec.Egress = []string{"default.test"}
	})

	t.Run("refused at create", func(t *testing.T) {
		// Entries that are not host names are bad requests; hosts beyond
		// the operator's permit list are forbidden, naming it.
		for _, entries := range [][]string{{"http://x.allowed.test"}, {"*"}} {
			rep := e.place("alice", session.PlaceRequest{Op: session.PlaceCreate, Session: session.NewID(), Egress: entries})
			wantCode(t, strings.Join(entries, ","), rep, session.CodeBadRequest, "")
		}
		for _, entries := range [][]string{{"allowed.test"}, {"a.allowed.test:8443"}, {"fixed.test"}} {
			rep := e.place("alice", session.PlaceRequest{Op: session.PlaceCreate, Session: session.NewID(), Egress: entries})
			wantCode(t, strings.Join(entries, ","), rep, session.CodeForbidden, "(sandbox.egress_permit)")
		}
		rep := e.place("alice", session.PlaceRequest{Op: session.PlaceCreate, Session: session.NewID(), Egress: []string{"evil.test"}})
		wantCode(t, "evil", rep, session.CodeForbidden, "egress to evil.test is not permitted on this server (sandbox.egress_permit)")
	})

	id := session.NewID()
	if rep := e.place("alice", session.PlaceRequest{Op: session.PlaceCreate, Session: id,
		Harness: command("bash", "-c", `read -r _; for u in $GET; do bash -c "$0" bash "$u"; done`, httpGetScript),
		Egress:  []string{"API.allowed.test", "api.allowed.test", "*.deep.allowed.test", "fixed.test:8080"}}); rep.Error != nil {
		t.Fatalf("create: %v", rep.Error)
	}
	info := e.cmd(id, "alice", session.Command{Op: session.OpInfo})
	if got := strings.Join(info.Session.Egress, ","); got != "api.allowed.test,*.deep.allowed.test,fixed.test:8080" {
		t.Errorf("session egress = %q", got)
	}
	e.cmd(id, "alice", session.Command{Op: session.OpMember, User: "bob", Role: session.RoleDriver})
	e.cmd(id, "alice", session.Command{Op: session.OpSecretSet, Name: "GET", Value: "http://api.allowed.test/ http://default.test/ http://other.allowed.test/"})
	w := e.watch(id)
	e.prompt(id, "bob", "go")
	w.until("turn_finished", finished(1))
	out := outputText(t, w.evs, 1, "stdout")
	for _, want := range []string{"200\nhello from api.allowed.test", "200\nhello from default.test", "403"} {
		if !strings.Contains(out, want) {
			t.Errorf("turn 1 output %q lacks %q", out, want)
		}
	}
	if strings.Contains(out, "hello from other.allowed.test") {
		t.Errorf("reached a host the session did not list: %q", out)
	}

	t.Run("owner changes it", func(t *testing.T) {
		rep := e.cmd(id, "bob", session.Command{Op: session.OpEgress, Egress: []string{"other.allowed.test"}})
		wantCode(t, "driver", rep, session.CodeForbidden, "")
		rep = e.cmd(id, "alice", session.Command{Op: session.OpEgress, Egress: []string{"nope.test"}})
		wantCode(t, "unpermitted", rep, session.CodeForbidden, "egress to nope.test is not permitted")
		rep = e.cmd(id, "alice", session.Command{Op: session.OpEgress, Egress: []string{"other.allowed.test"}})
		if rep.Error != nil || rep.Session == nil || strings.Join(rep.Session.Egress, ",") != "other.allowed.test" {
			t.Fatalf("set egress: %+v", rep)
		}
		e.prompt(id, "bob", "again")
		w.until("turn_finished", finished(2))
		out := outputText(t, w.evs, 2, "stdout")
		if !strings.Contains(out, "200\nhello from other.allowed.test") || strings.Contains(out, "hello from api.allowed.test") {
			t.Errorf("turn 2 output %q: want other.allowed.test reachable, api.allowed.test not", out)
		}
	})
}

func TestEgressPolicy(t *testing.T) {
	p, err := newEgressPolicy([]string{"Default.test"}, []string{"*.a.test", "b.test", "10.0.0.1", "c.test:8080"}, false)
	if err != nil {
		t.Fatal(err)
	}
	for entry, ok := range map[string]bool{
		"x.a.test": true, "*.a.test": true, "*.x.a.test": true, "a.test": false, "x.a.test:443": true, "x.a.test:22": false,
		"b.test": true, "*.b.test": false, "x.b.test": false, "10.0.0.1": true, "10.0.0.2": false,
		"c.test:8080": true, "c.test": false, "c.test:80": false,
	} {
		_, err := p.check([]string{entry})
		if (err == nil) != ok {
			t.Errorf("check(%q) = %v, want permitted %v", entry, err, ok)
		}
	}
	if got := strings.Join(p.effective([]string{"x.a.test", "default.test", "gone.test"}), ","); got != "default.test,x.a.test" {
		t.Errorf("effective = %q", got)
	}
	if _, err := newEgressPolicy(nil, []string{"http://x"}, false); err == nil {
		t.Error("a bad permit entry was accepted")
	}
	b, _ := json.Marshal(session.Meta{Secrets: map[string]session.Secret{"K": {Value: "v"}}})
	if !bytes.Contains(b, []byte(`"value":"v"`)) {
		t.Errorf("meta does not store values: %s", b)
	}
}

func TestSealLegacy(t *testing.T) {
	secrets := map[string]session.Secret{
		"OLD": {Value: "in clear", UpdatedBy: "alice"},
		"NEW": {Sealed: testSecretKeys.Seal("NEW", "sealed")},
	}
	sealLegacy(testSecretKeys, secrets)
	if s := secrets["OLD"]; s.Value != "" || s.Sealed == "" || s.UpdatedBy != "alice" {
		t.Fatalf("OLD %+v", s)
	}
	for n, want := range map[string]string{"OLD": "in clear", "NEW": "sealed"} {
		if v, err := testSecretKeys.Open(n, secrets[n]); err != nil || v != want {
			t.Errorf("%s: %q %v", n, v, err)
		}
	}
}
