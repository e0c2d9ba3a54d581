package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestVMHost_RefusesBadStarts(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(short, []byte("abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no listen", []string{"vmhost"}, "--listen is required"},
		{"no token", []string{"vmhost", "--listen", "127.0.0.1:0"}, "--token-file is required"},
		{"short token", []string{"vmhost", "--listen", "127.0.0.1:0", "--token-file", short}, "shorter than 16"},
		{"every address", []string{"vmhost", "--listen", "0.0.0.0:7000", "--token-file", good}, "give --host"},
		{"no image", []string{"vmhost", "--listen", "127.0.0.1:0", "--token-file", good, "--dir", empty},
			"atrium vmhost image build --dir " + empty},
		{"bad allow", []string{"vmhost", "--listen", "127.0.0.1:0", "--token-file", good, "--dir", empty, "--allow", "not a host!"},
			"vmhost: --allow"},
		{"status without token", []string{"vmhost", "status"}, "--token-file is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := run(context.Background(), tc.args, strings.NewReader(""), &out, &errb, func(string) string { return "" })
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want it to say %q", err, tc.want)
			}
		})
	}
}
