package auth_test

import (
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/session"
)

func TestBootstrapKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if _, err := auth.ReadBootstrapKey(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("no key yet: %v", err)
	}
	k, err := auth.EnsureBootstrapKey(dir)
	if err != nil || len(k) < 50 {
		t.Fatalf("key %q, %v", k, err)
	}
	path := filepath.Join(dir, auth.BootstrapKeyFile)
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st.Mode(), err)
	}
	if again, err := auth.EnsureBootstrapKey(dir); err != nil || again != k {
		t.Fatalf("second start made another key: %q %v", again, err)
	}
	if read, err := auth.ReadBootstrapKey(dir); err != nil || read != k {
		t.Fatalf("read %q %v", read, err)
	}
	if other, _ := auth.EnsureBootstrapKey(t.TempDir()); other == k {
		t.Fatal("two data dirs share a key")
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := auth.EnsureBootstrapKey(dir); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a world-readable key: %v", err)
	}
}

func TestBootstrap_Authenticate(t *testing.T) {
	key, err := auth.EnsureBootstrapKey(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b := &auth.Bootstrap{Key: key}
	req := func(method, path, bearer string) *http.Request {
		r := httptest.NewRequest(method, path, nil)
		r.Header.Set("Authorization", "Bearer "+bearer)
		return r
	}
	p, err := b.Authenticate(req("POST", "/v1/tokens", auth.BootstrapToken(key, "ann o'neil", "acme")))
	if err != nil || p.User != "ann o'neil" || p.Tenant != "acme" || !p.Admin || !p.Operator || p.Via != auth.ViaBootstrap {
		t.Fatalf("%+v %v", p, err)
	}
	for name, c := range map[string]struct {
		r       *http.Request
		noCreds bool
		msg     string
	}{
		"other route": {r: req("GET", "/v1/sessions", auth.BootstrapToken(key, "ann", "")), msg: "only creates API tokens"},
		"wrong key":   {r: req("POST", "/v1/tokens", auth.BootstrapToken(strings.Repeat("a", len(key)), "ann", "")), msg: "invalid bootstrap key"},
		"no user":     {r: req("POST", "/v1/tokens", "atrboot_"+key), msg: "invalid bootstrap key"},
		"bad user":    {r: req("POST", "/v1/tokens", auth.BootstrapToken(key, " ", "")), msg: "no valid user"},
		"api token":   {r: req("POST", "/v1/tokens", "atr_abc_def"), noCreds: true},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := b.Authenticate(c.r)
			if err == nil || !errors.Is(err, session.ErrUnauthenticated) || errors.Is(err, auth.ErrNoCredentials) != c.noCreds {
				t.Fatalf("%+v %v", p, err)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("%v, want %q", err, c.msg)
			}
		})
	}
	if _, err := (&auth.Bootstrap{}).Authenticate(req("POST", "/v1/tokens", auth.BootstrapToken("", "ann", ""))); err == nil {
		t.Fatal("an empty key authenticates")
	}
}
