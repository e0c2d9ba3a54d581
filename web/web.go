// Package web is Atrium's browser UI, embedded in the binary. It has no build
// step: the files under static/ (one HTML page, CSS, plain ES modules and an
// icon) are served as they are. The UI is a client of the wire contract of
// DESIGN §7 only: REST under /v1/, the WebSocket of a session, and the login
// routes under /auth/.
//
// The pages carry no inline script, no inline style attribute and no eval, so
// they run under the strict policy in CSP, which Handler sets on everything it
// serves.
package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/json"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed static
var static embed.FS

// CSP is the Content-Security-Policy of the UI: scripts, styles, fonts and
// images from Atrium itself only, connections (fetch, WebSocket) to Atrium
// only, no inline script or style, no eval, no plugins, no framing, and
// Trusted Types enforced so that no string can reach an HTML or script sink.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; " +
	"connect-src 'self'; manifest-src 'self'; object-src 'none'; frame-ancestors 'none'; base-uri 'none'; " +
	"form-action 'self'; require-trusted-types-for 'script'; trusted-types 'none'"

// FS returns the UI's files.
func FS() fs.FS {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree always has static/.
	}
	return sub
}

// file is one embedded file, ready to serve.
type file struct {
	name  string
	data  []byte
	etag  string
	ctype string
}

// Handler serves the UI. Files are served with a strong ETag and
// "Cache-Control: no-cache", so browsers revalidate and get 304s until the
// binary changes. A path with no dot in its last segment that names no file
// (a deep link such as /s/<id>) gets index.html, so the client-side router
// can show it; a missing path with a dot (an asset) is a 404. Paths under
// /v1/ and /auth/ are never the UI's: the gateway serves them, and one that
// reaches this handler is a 404 JSON error, not the HTML page.
func Handler() http.Handler {
	files := map[string]*file{}
	err := fs.WalkDir(FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(FS(), p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		ctype := mime.TypeByExtension(path.Ext(p))
		if ctype == "" {
			ctype = http.DetectContentType(data)
		}
		files["/"+p] = &file{
			name:  p,
			data:  data,
			etag:  `"` + base64.RawURLEncoding.EncodeToString(sum[:12]) + `"`,
			ctype: ctype,
		}
		return nil
	})
	if err != nil {
		panic(err) // the embedded tree is readable.
	}
	index := files["/index.html"]
	if index == nil {
		panic("web: static/index.html is missing")
	}
	return &handler{files: files, index: index}
}

type handler struct {
	files map[string]*file
	index *file
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", CSP)
	p := path.Clean("/" + r.URL.Path)
	if p == "/v1" || p == "/auth" || strings.HasPrefix(p, "/v1/") || strings.HasPrefix(p, "/auth/") {
		hd.Set("Content-Type", "application/json")
		hd.Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNotFound)
		msg, _ := json.Marshal("no route for " + r.Method + " " + p)
		_, _ = w.Write([]byte(`{"error":{"code":"not_found","message":` + string(msg) + "}}\n"))
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hd.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed: the web UI is read with GET", http.StatusMethodNotAllowed)
		return
	}
	f := h.files[p]
	if p == "/" || p == "/index.html" {
		f = h.index
	}
	if f == nil {
		if strings.Contains(path.Base(p), ".") {
			http.Error(w, "not found: "+p, http.StatusNotFound)
			return
		}
		f = h.index // a route of the client-side router
	}
	hd.Set("Content-Type", f.ctype)
	hd.Set("ETag", f.etag)
	hd.Set("Cache-Control", "no-cache")
	// No modification time: the ETag decides, and ServeContent answers
	// If-None-Match with 304 and HEAD without a body.
	http.ServeContent(w, r, f.name, time.Time{}, bytes.NewReader(f.data))
}
