package server

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/atriumhq/atrium/session"
)

// SecretKeysFile is the keyring `atrium dev` generates in its data directory
// when none is configured.
const SecretKeysFile = "secrets.keys"

// ReadSecretKeys reads a secrets keyring file (session.ParseSecretKeyring's
// format). A file that others than its owner may read is refused.
func ReadSecretKeys(path string) (*session.SecretKeyring, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("secrets key file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("secrets key file %s has mode %v: make it readable by its owner only (chmod 600)", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("secrets key file: %w", err)
	}
	k, err := session.ParseSecretKeyring(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// secretKeys returns the keyring of the node: cfg.SecretKeys if set; in dev
// mode, the data directory's (generated, mode 0600, on first use); else nil,
// and secrets cannot be set.
func secretKeys(cfg *Config, log *slog.Logger) (*session.SecretKeyring, error) {
	if cfg.SecretKeys != nil {
		return cfg.SecretKeys, nil
	}
	if cfg.AuthMode != "" && cfg.AuthMode != AuthDev {
		log.Warn("no secrets key configured (secrets.key_file or ATRIUM_SECRETS_KEYS): `atrium secret set` is refused")
		return nil, nil
	}
	path := filepath.Join(cfg.DataDir, SecretKeysFile)
	k, err := ReadSecretKeys(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, err
	}
	line := session.NewSecretKeyLine("dev-"+time.Now().UTC().Format("20060102")) + "\n"
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create secrets key file: %w", err)
	}
	if _, err := f.WriteString(line); err != nil {
		_ = f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	log.Info("generated a secrets key: session secrets are encrypted at rest with it", "file", path)
	return session.ParseSecretKeyring(line)
}
