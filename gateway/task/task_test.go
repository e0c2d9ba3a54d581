package task

import (
	"strings"
	"testing"

	"github.com/atriumhq/atrium/session"
)

func TestParseRepo(t *testing.T) {
	good := map[string]repoRef{
		"https://github.com/acme/widgets":        {url: "https://github.com/acme/widgets", host: "github.com", owner: "acme", name: "widgets"},
		"https://GitHub.com/acme/widgets.git":    {url: "https://GitHub.com/acme/widgets.git", host: "github.com", owner: "acme", name: "widgets"},
		"http://127.0.0.1:3000/acme/w.x/":        {url: "http://127.0.0.1:3000/acme/w.x", host: "127.0.0.1:3000", owner: "acme", name: "w.x"},
		"https://gitea.example.com/o-1/r_2.git/": {url: "https://gitea.example.com/o-1/r_2.git", host: "gitea.example.com", owner: "o-1", name: "r_2"},
	}
	for in, want := range good {
		got, err := parseRepo(in)
		if err != nil || got != want {
			t.Errorf("parseRepo(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	bad := map[string]string{
		"":                                   "repo is required",
		"git@github.com:acme/widgets.git":    "is not a URL",
		"ssh://git@github.com/acme/w.git":    "not an http(s) URL",
		"https://tok:x@github.com/acme/w":    "holds credentials",
		"https://github.com/acme":            "OWNER/REPOSITORY",
		"https://github.com/acme/w/tree/dev": "OWNER/REPOSITORY",
		"https://github.com/acme/w?x=1":      "not a repository URL",
		"https://github.com/../w":            "unusual",
	}
	for in, want := range bad {
		_, err := parseRepo(in)
		if err == nil || session.AsError(err).Code != session.CodeBadRequest || !strings.Contains(err.Error(), want) {
			t.Errorf("parseRepo(%q) = %v, want a bad_request saying %q", in, err, want)
		}
	}
}

func TestValidBase(t *testing.T) {
	for _, b := range []string{"main", "release/1.2", "dev_x-y"} {
		if err := validBase(b); err != nil {
			t.Errorf("validBase(%q) = %v", b, err)
		}
	}
	for _, b := range []string{"", "-x", "a..b", "a b", "x.lock", "/x", "x/", "a;rm"} {
		if err := validBase(b); err == nil {
			t.Errorf("validBase(%q) accepted it", b)
		}
	}
}

func TestFirstLine(t *testing.T) {
	if got := firstLine("\n  Fix the build \nmore"); got != "Fix the build" {
		t.Errorf("firstLine = %q", got)
	}
	if got := truncate("ééé", 3); got != "é" {
		t.Errorf("truncate cut a rune: %q", got)
	}
}
