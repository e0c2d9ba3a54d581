package main

import (
	"strings"
	"testing"
)

// TestCLI_Secrets: `atrium secret` against the real stack; the harness sees
// the secret set from stdin, and `new --egress` is refused by a server that
// permits no egress.
func TestCLI_Secrets(t *testing.T) {
	c := newCLI(t, startRealStack(t))
	id := strings.TrimSpace(c.ok("new", "--title", "secrets"))
	if _, _, err := c.run(cliContext(t), strings.NewReader("twelve-chars\n"), "secret", "set", id, "TOK"); err != nil {
		t.Fatalf("secret set: %v", err)
	}
	_, errs, err := c.run(cliContext(t), nil, "secret", "set", id, "OTHER", "--value", "v")
	if err != nil || !strings.Contains(errs, "warning: --value") {
		t.Errorf("secret set --value: %v %q", err, errs)
	}
	if out := c.ok("secret", "ls", id); !strings.Contains(out, "TOK") || !strings.Contains(out, "OTHER") || strings.Contains(out, "twelve") {
		t.Errorf("secret ls = %q", out)
	}
	if out, _, err := c.run(cliContext(t), nil, "send", id, `echo "len=${#TOK}"`, "--wait"); err != nil || out != "len=12\n" {
		t.Errorf("send: %v %q", err, out)
	}
	c.ok("secret", "rm", id, "OTHER")
	if _, _, err := c.run(cliContext(t), nil, "secret", "set", id, "PATH"); err == nil || !strings.Contains(err.Error(), "reserved") {
		t.Errorf("reserved name: %v", err)
	}
	if _, _, err := c.run(cliContext(t), nil, "new", "--egress", "github.com"); err == nil || !strings.Contains(err.Error(), "sandbox.egress_permit") {
		t.Errorf("new --egress: %v", err)
	}
	if _, _, err := c.run(cliContext(t), nil, "egress", "set", id, "github.com"); err == nil || !strings.Contains(err.Error(), "sandbox.egress_permit") {
		t.Errorf("egress set: %v", err)
	}
	if out := c.ok("egress", "set", id); !strings.Contains(out, "no egress of its own") {
		t.Errorf("egress set (clear) = %q", out)
	}
}
