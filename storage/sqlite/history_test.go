package sqlite_test

import (
	"github.com/atriumhq/atrium/actor"
	"github.com/atriumhq/atrium/storage/sqlite"
)

// Log is the actor's History; Dir is its Histories through the adapter in cmd/
// (Dir's methods return *Log rather than actor.History).
var _ actor.History = (*sqlite.Log)(nil)
