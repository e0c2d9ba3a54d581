// Package audit is the gateway's durable record of decisions that matter:
// logins, API token creation and revocation, membership and role changes,
// denied requests and session deletions, with who, what, when and from where.
//
// Log keeps the entries in a JetStream stream (file storage, one subject per
// tenant, kept DefaultMaxAge) and lists a tenant's entries newest first, with
// filters and opaque cursors.
//
// Entries never carry prompt text, harness payloads or credentials. Nothing
// in Atrium records prompts or harness output here, so there is no setting
// to include them.
package audit

import (
	"context"

	"github.com/atriumhq/atrium/session/api"
)

// Outcomes of an Entry.
const (
	OK     = "ok"
	Denied = "denied"
	Failed = "failed"
)

// Actions of an Entry.
const (
	ActLogin          = "login"
	ActLoginFailed    = "login_failed"
	ActLogout         = "logout"
	ActAuthFailed     = "auth_failed"
	ActTokenCreated   = "token_created"
	ActTokenRevoked   = "token_revoked"
	ActMemberChanged  = "member_changed"
	ActSessionCreated = "session_created"
	ActSessionDeleted = "session_deleted"
	ActDenied         = "denied"
)

// Entry is one audit record, the AuditEntry of the wire contract (GET
// /v1/audit). ID and Time are set by the log when empty.
type Entry = api.AuditEntry

// Recorder records audit entries. Record must not block its caller for long
// and reports failures (a full or unreachable store) as errors; callers
// decide whether a failure to audit refuses the request.
type Recorder interface {
	Record(ctx context.Context, e Entry) error
}

// Discard is a Recorder that records nothing, for tests and tools.
var Discard Recorder = discard{}

type discard struct{}

func (discard) Record(context.Context, Entry) error { return nil }
