package server

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/session"
)

func TestSecretKeys(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	t.Run("dev generates one in the data dir", func(t *testing.T) {
		dir := t.TempDir()
		k, err := secretKeys(&Config{AuthMode: AuthDev, DataDir: dir}, log)
		if err != nil || k == nil {
			t.Fatalf("keyring %v %v", k, err)
		}
		fi, err := os.Stat(filepath.Join(dir, SecretKeysFile))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("key file %v %v", fi, err)
		}
		sealed := session.Secret{Sealed: k.Seal("A", "v")}
		again, err := secretKeys(&Config{AuthMode: AuthDev, DataDir: dir}, log) // the same key next time
		if err != nil {
			t.Fatal(err)
		}
		if v, err := again.Open("A", sealed); err != nil || v != "v" {
			t.Fatalf("reopened %q %v", v, err)
		}
	})
	t.Run("serve without a key", func(t *testing.T) {
		dir := t.TempDir()
		if k, err := secretKeys(&Config{AuthMode: AuthOIDC, DataDir: dir}, log); k != nil || err != nil {
			t.Fatalf("keyring %v %v", k, err)
		}
		if _, err := os.Stat(filepath.Join(dir, SecretKeysFile)); err == nil {
			t.Fatal("serve generated a key")
		}
	})
	t.Run("a key file others can read", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "keys")
		if err := os.WriteFile(p, []byte(session.NewSecretKeyLine("k1")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadSecretKeys(p); err == nil || !strings.Contains(err.Error(), "chmod 600") {
			t.Fatalf("got %v", err)
		}
		_ = os.Chmod(p, 0o600)
		if k, err := ReadSecretKeys(p); err != nil || k.Current() != "k1" {
			t.Fatalf("got %v %v", k, err)
		}
	})
}
