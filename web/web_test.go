package web_test

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/web"
)

func get(t *testing.T, h http.Handler, method, path string, hdr map[string]string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func body(t *testing.T, r *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return string(b)
}

// TestHandler_Routes checks what each kind of path gets: files, the page for
// the client-side router's deep links, 404s for missing assets and for API
// paths, and 304s for revalidation.
func TestHandler_Routes(t *testing.T) {
	h := web.Handler()
	index := body(t, get(t, h, "GET", "/index.html", nil))
	if !strings.Contains(index, `<script type="module" src="/js/main.js">`) {
		t.Fatalf("index.html does not load /js/main.js:\n%s", index)
	}
	for _, tc := range []struct {
		name, method, path string
		status             int
		ctype, contains    string
	}{
		{"root", "GET", "/", 200, "text/html", `src="/js/main.js"`},
		{"deep link", "GET", "/s/ses_abc123", 200, "text/html", `src="/js/main.js"`},
		{"deep link with slash", "GET", "/s/ses_abc123/", 200, "text/html", `src="/js/main.js"`},
		{"module", "GET", "/js/main.js", 200, "text/javascript", "boot()"},
		{"stylesheet", "GET", "/app.css", 200, "text/css", "prefers-color-scheme: dark"},
		{"icon", "GET", "/favicon.svg", 200, "image/svg+xml", "<svg"},
		{"missing asset", "GET", "/js/nope.js", 404, "text/plain", "not found"},
		{"missing icon", "GET", "/favicon.ico", 404, "text/plain", "not found"},
		{"api path", "GET", "/v1/whoami", 404, "application/json", `"code":"not_found"`},
		{"auth path", "GET", "/auth/config", 404, "application/json", `"code":"not_found"`},
		{"post", "POST", "/", 405, "text/plain", "GET"},
		{"head", "HEAD", "/s/x", 200, "text/html", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := get(t, h, tc.method, tc.path, nil)
			b := body(t, r)
			if r.StatusCode != tc.status || !strings.HasPrefix(r.Header.Get("Content-Type"), tc.ctype) || !strings.Contains(b, tc.contains) {
				t.Fatalf("%s %s: %d %q, body %.200q; want %d %s containing %q", tc.method, tc.path, r.StatusCode, r.Header.Get("Content-Type"), b, tc.status, tc.ctype, tc.contains)
			}
			if got := r.Header.Get("Content-Security-Policy"); got != web.CSP {
				t.Fatalf("%s: CSP %q, want web.CSP", tc.path, got)
			}
			if tc.method == "HEAD" && b != "" {
				t.Fatalf("HEAD has a body")
			}
		})
	}

	t.Run("revalidation", func(t *testing.T) {
		r := get(t, h, "GET", "/js/main.js", nil)
		etag := r.Header.Get("ETag")
		if etag == "" || r.Header.Get("Cache-Control") != "no-cache" {
			t.Fatalf("ETag %q Cache-Control %q, want a strong ETag and no-cache", etag, r.Header.Get("Cache-Control"))
		}
		if r := get(t, h, "GET", "/js/main.js", map[string]string{"If-None-Match": etag}); r.StatusCode != 304 {
			t.Fatalf("If-None-Match with the ETag: status %d, want 304", r.StatusCode)
		}
		if r := get(t, h, "GET", "/js/main.js", map[string]string{"If-None-Match": `"other"`}); r.StatusCode != 200 {
			t.Fatalf("If-None-Match with another ETag: status %d, want 200", r.StatusCode)
		}
	})
}

// TestFS_StrictCSP checks the files for what the strict Content-Security-
// Policy (web.CSP) would block: inline scripts, style attributes and inline
// event handlers in HTML, and string-to-code or string-to-HTML sinks in the
// scripts. The browser tests run the pages under the policy too; this finds
// a slip without a browser.
func TestFS_StrictCSP(t *testing.T) {
	if !strings.Contains(web.CSP, "script-src 'self'") || strings.Contains(web.CSP, "unsafe-") {
		t.Fatalf("CSP %q is not strict", web.CSP)
	}
	inlineScript := regexp.MustCompile(`<script(?:\s[^>]*)?>\s*[^<\s]`)
	htmlBans := []*regexp.Regexp{regexp.MustCompile(`(?i)\sstyle\s*=`), regexp.MustCompile(`(?i)\son[a-z]+\s*=`), regexp.MustCompile(`(?i)<style`), regexp.MustCompile(`(?i)javascript:`)}
	jsBans := []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "setAttribute('style'", `setAttribute("style"`, "javascript:", "setTimeout('", `setTimeout("`}
	checked := 0
	err := fs.WalkDir(web.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(web.FS(), p)
		if err != nil {
			return err
		}
		s := string(b)
		switch {
		case strings.HasSuffix(p, ".html"):
			checked++
			if inlineScript.MatchString(s) {
				t.Errorf("%s has an inline script", p)
			}
			for _, re := range htmlBans {
				if loc := re.FindStringIndex(s); loc != nil {
					t.Errorf("%s: %q is blocked by the CSP", p, s[loc[0]:min(len(s), loc[1]+20)])
				}
			}
			if strings.Contains(s, "http://") || strings.Contains(s, "https://") {
				t.Errorf("%s refers to another site; everything must be served by Atrium", p)
			}
		case strings.HasSuffix(p, ".js"):
			checked++
			for _, ban := range jsBans {
				if strings.Contains(s, ban) {
					t.Errorf("%s uses %s, which the CSP (or Trusted Types) blocks", p, ban)
				}
			}
			if regexp.MustCompile(`(?m)^\s*import .* from '(https?:)?//`).MatchString(s) {
				t.Errorf("%s imports a module from another site", p)
			}
		case strings.HasSuffix(p, ".css"):
			checked++
			if regexp.MustCompile(`@import|url\((['"]?)(https?:)?//`).MatchString(s) {
				t.Errorf("%s loads something from another site", p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 3 {
		t.Fatalf("checked %d files, want the page, the stylesheet and the scripts", checked)
	}
}
