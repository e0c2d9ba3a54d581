package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/web"
)

// TestEveryKindHasARenderer fails when an event kind is added to the
// session package without a renderer in the CLI (cliKinds, render.go: logs
// and attach) and in the web UI (the renderers of web/static/js/rows.js and
// agent.js). The chat renderer has its own check (gateway/channel,
// TestChatKinds). Issue 14.
func TestEveryKindHasARenderer(t *testing.T) {
	kinds := sessionKinds(t)
	// The web UI: a method named after the kind in rows.js's renderers or
	// agent.js's agentRenderers (`  kind(ev, d…) {`).
	method := regexp.MustCompile(`(?m)^  ([a-z_]+)\(ev\b`)
	webKinds := map[string]bool{}
	for _, name := range []string{"js/rows.js", "js/agent.js"} {
		b, err := fs.ReadFile(web.FS(), name)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range method.FindAllStringSubmatch(string(b), -1) {
			webKinds[m[1]] = true
		}
	}
	for _, k := range kinds {
		if _, ok := cliKinds[k]; !ok {
			t.Errorf("event kind %q has no entry in cliKinds (cmd/atrium/render.go): render it in logs and attach", k)
		}
		if !webKinds[string(k)] {
			t.Errorf("event kind %q has no renderer in the web UI (web/static/js/rows.js or agent.js)", k)
		}
		// And summary never fails on it, whatever its data.
		for _, data := range []string{`{}`, `{"turn":1,"text":"x","content":[{"type":"diff","path":"a","new_text":"b"}]}`} {
			if s := summary(session.Event{Kind: k, Data: []byte(data)}); strings.ContainsAny(s, "\x1b\r") {
				t.Errorf("summary of %s %s = %q", k, data, s)
			}
		}
	}
	known := map[session.Kind]bool{}
	for _, k := range kinds {
		known[k] = true
	}
	for k := range cliKinds {
		if !known[k] {
			t.Errorf("cliKinds lists %q, which is not a kind of the session package", k)
		}
	}
}

// sessionKinds returns every constant of type Kind declared in the session
// package's source, so a new kind is found without anyone listing it.
func sessionKinds(t *testing.T) []session.Kind {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", "session", "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("session sources: %v", err)
	}
	fset := token.NewFileSet()
	var kinds []session.Kind
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Kind" {
					continue
				}
				for _, v := range vs.Values {
					if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						s, _ := strconv.Unquote(lit.Value)
						kinds = append(kinds, session.Kind(s))
					}
				}
			}
		}
	}
	if len(kinds) < 12 {
		t.Fatalf("found only %d event kinds in the session package: the parser missed them", len(kinds))
	}
	return kinds
}
