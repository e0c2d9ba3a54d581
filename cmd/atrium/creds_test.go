package main

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway/client/clienttest"
)

func mustB64(tb testing.TB, s string) []byte {
	tb.Helper()
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func TestCredStore_SaveLoad(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "atrium")
	s := &credStore{path: filepath.Join(dir, credentialsName)}
	if l, err := s.get("http://x"); err != nil || l != nil {
		t.Fatalf("get from a missing file = %v, %v", l, err)
	}
	exp := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := s.put("http://x", &storedLogin{IDToken: "id1", RefreshToken: "r1", Expiry: exp}); err != nil {
		t.Fatal(err)
	}
	if err := s.put("http://y", &storedLogin{IDToken: "id2"}); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(s.path)
	if err != nil {
		t.Fatal(err)
	}
	dst, _ := os.Stat(dir)
	if st.Mode().Perm() != 0o600 || dst.Mode().Perm() != 0o700 {
		t.Fatalf("modes: file %v, dir %v", st.Mode(), dst.Mode())
	}
	l, err := s.get("http://x")
	if err != nil || l.IDToken != "id1" || l.RefreshToken != "r1" || !l.Expiry.Equal(exp) {
		t.Fatalf("get = %+v, %v", l, err)
	}
	if ok, err := s.remove("http://x"); !ok || err != nil {
		t.Fatalf("remove = %v, %v", ok, err)
	}
	if ok, err := s.remove("http://x"); ok || err != nil {
		t.Fatalf("second remove = %v, %v", ok, err)
	}
	if l, _ := s.get("http://y"); l == nil || l.IDToken != "id2" {
		t.Fatalf("the other login was lost: %+v", l)
	}
	// No temporary files are left behind.
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("files in the config dir: %v", entries)
	}
}

func TestCredStore_RefusesReadableFile(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no Unix permissions on Windows")
	}
	s := &credStore{path: filepath.Join(t.TempDir(), credentialsName)}
	if err := s.put("http://x", &storedLogin{IDToken: "id"}); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(s.path, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := s.get("http://x")
	if err == nil || !strings.Contains(err.Error(), "accessible to other users (mode 0644)") || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("get of a 0644 file = %v", err)
	}

	// The client commands refuse it too, before sending anything.
	srv := clienttest.New(t, clienttest.Options{})
	c := newCLI(t, srv.URL)
	c.env["ATRIUM_CONFIG_DIR"] = filepath.Dir(s.path)
	_, _, err = c.run(cliContext(t), nil, "ls")
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "chmod 600") || len(srv.Authorizations()) != 0 {
		t.Fatalf("ls with a 0644 credentials file = %v", err)
	}
	// A token given explicitly does not need the file.
	c.env["ATRIUM_TOKEN"] = "dev:alice"
	c.ok("ls")
}

func TestCredStore_Corrupt(t *testing.T) {
	s := &credStore{path: filepath.Join(t.TempDir(), credentialsName)}
	if err := os.WriteFile(s.path, []byte("{nope"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.get("http://x"); err == nil || !strings.Contains(err.Error(), "not valid JSON") {
		t.Fatalf("get of a corrupt file = %v", err)
	}
	if err := os.WriteFile(s.path, []byte(`{"version":99}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.get("http://x"); err == nil || !strings.Contains(err.Error(), "newer atrium") {
		t.Fatalf("get of a future file = %v", err)
	}
}

func TestCred_ConfigDir(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if d, err := configDir(env(map[string]string{"ATRIUM_CONFIG_DIR": "/x/y", "HOME": "/h"})); err != nil || d != "/x/y" {
		t.Fatalf("ATRIUM_CONFIG_DIR: %q, %v", d, err)
	}
	if _, err := configDir(env(nil)); err == nil {
		t.Fatal("no HOME: want an error")
	}
	if runtime.GOOS == "linux" {
		if d, _ := configDir(env(map[string]string{"XDG_CONFIG_HOME": "/xdg", "HOME": "/h"})); d != "/xdg/atrium" {
			t.Fatalf("XDG_CONFIG_HOME: %q", d)
		}
		if d, _ := configDir(env(map[string]string{"XDG_CONFIG_HOME": "relative", "HOME": "/h"})); d != "/h/.config/atrium" {
			t.Fatalf("relative XDG_CONFIG_HOME: %q", d)
		}
	}
}

func TestCred_IDTokenExpiry(t *testing.T) {
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	exp, err := idTokenExpiry("h." + enc(`{"exp":1893456000,"sub":"x"}`) + ".sig")
	if err != nil || !exp.Equal(time.Unix(1893456000, 0)) {
		t.Fatalf("exp = %v, %v", exp, err)
	}
	for name, tok := range map[string]string{
		"not a jwt":  "abc",
		"bad base64": "h.!!!.s",
		"no exp":     "h." + enc(`{"sub":"x"}`) + ".s",
		"bad exp":    "h." + enc(`{"exp":"soon"}`) + ".s",
	} {
		if _, err := idTokenExpiry(tok); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestCred_Scopes(t *testing.T) {
	if got := strings.Join(scopesFor(nil, []string{"openid", "offline_access"}), " "); got != "openid email profile offline_access" {
		t.Fatalf("default scopes with offline_access = %q", got)
	}
	if got := strings.Join(scopesFor(nil, []string{"openid"}), " "); got != "openid email profile" {
		t.Fatalf("default scopes = %q", got)
	}
	if got := strings.Join(scopesFor([]string{"email", "groups"}, nil), " "); got != "openid email groups" {
		t.Fatalf("server scopes = %q", got)
	}
	for name, tc := range map[string]struct {
		secret  string
		methods []string
		want    string
	}{
		"public client": {"", []string{"client_secret_basic"}, authStyleParams},
		"post listed":   {"s", []string{"client_secret_basic", "client_secret_post"}, authStyleParams},
		"basic only":    {"s", []string{"client_secret_basic"}, authStyleHeader},
		"not listed":    {"s", nil, authStyleHeader},
	} {
		if got := authStyleFor(tc.secret, tc.methods); got != tc.want {
			t.Errorf("%s: %s, want %s", name, got, tc.want)
		}
	}
}
