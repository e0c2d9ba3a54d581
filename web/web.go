// Package web is Atrium's browser UI, embedded in the binary. It has no build
// step: the files under static/ are served as they are.
package web

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed static
var static embed.FS

// FS returns the UI's files.
func FS() fs.FS {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree always has static/.
	}
	return sub
}

// Handler serves the UI.
func Handler() http.Handler {
	return http.FileServerFS(FS())
}
