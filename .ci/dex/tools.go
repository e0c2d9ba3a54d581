//go:build tools

// Package dex pins the Dex OpenID Connect provider (v2.41.1) that the
// identity tests run (cmd/atrium/dex_e2e_test.go). .ci/deps builds it
// from here: `go install` cannot build Dex (its go.mod has a replace
// directive), and the checksum database has no record of the api/v2
// pseudo-version it needs, so go.sum here pins every module's hash.
package dex

import _ "github.com/dexidp/dex/cmd/dex"
