package main

import (
	"os/user"
	"strings"
	"testing"
)

// TestDevBanner is issue 23's banner, which printed `…/auth/dev?user=$USER`
// literally (signing the browser in as a user named "$USER") and a `send
// <ID>` that failed when pasted.
func TestDevBanner(t *testing.T) {
	b := devBanner("http://127.0.0.1:7080", "/srv/.atrium", "ann o'neil", "./bin/atrium")
	for _, want := range []string{
		"http://127.0.0.1:7080/auth/dev?user=ann+o%27neil",
		`ID=$(./bin/atrium new --title hello) && ./bin/atrium send "$ID" 'echo hello from the sandbox' --wait`,
		`curl -s -H 'Authorization: Bearer dev:ann o'\''neil' http://127.0.0.1:7080/v1/sessions`,
	} {
		if !strings.Contains(b, want) {
			t.Errorf("banner lacks %q:\n%s", want, b)
		}
	}
	for _, bad := range []string{"$USER", "<ID>", "ATRIUM_SERVER"} {
		if strings.Contains(b, bad) {
			t.Errorf("banner has %q:\n%s", bad, b)
		}
	}
	other := devBanner("http://127.0.0.1:9000", "/d", "bob", "atrium")
	if !strings.Contains(other, "export ATRIUM_SERVER=http://127.0.0.1:9000\n") {
		t.Errorf("a banner for another port does not point the CLI at it:\n%s", other)
	}
}

// TestDevUser: the CLI and the banner's browser link are the same user:
// $USER, else the operating system's name for the user, else "dev" —
// never a name nobody chose, as "you" was.
func TestDevUser(t *testing.T) {
	if got := devUser(func(k string) string { return map[string]string{"USER": "carol"}[k] }); got != "carol" {
		t.Errorf("with USER=carol: %q", got)
	}
	want := DefaultDevUser
	if u, err := user.Current(); err == nil && u.Username != "" {
		want = u.Username
	}
	if got := devUser(func(string) string { return "" }); got != want {
		t.Errorf("without USER: %q, want %q", got, want)
	}
	if got := devUser(func(string) string { return " bad\x00" }); got != want {
		t.Errorf("with an invalid USER: %q, want %q", got, want)
	}
}

func TestLocalURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://0.0.0.0:7080":   "http://127.0.0.1:7080",
		"http://[::]:7080":      "http://127.0.0.1:7080",
		"http://10.1.2.3:7080":  "http://10.1.2.3:7080",
		"http://127.0.0.1:7080": "http://127.0.0.1:7080",
	} {
		if got := localURL(in); got != want {
			t.Errorf("localURL(%q) = %q, want %q", in, got, want)
		}
	}
}
