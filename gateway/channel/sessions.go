package channel

import (
	"context"
	"encoding/json"

	"github.com/atriumhq/atrium/session"
)

// Sessions is what channels need from the gateway: commands on sessions,
// made as a principal. The gateway implements it with the same checks as
// its REST routes (session.RoleFor on the catalog, then again by the node),
// the same activation of hibernated sessions and the same audit entries.
// Errors are *session.Error values: not_found for a session the principal
// may not see, forbidden for a role too low, unavailable when no node
// answers (worth retrying).
type Sessions interface {
	// Create makes a session owned by p.
	Create(ctx context.Context, p session.Principal, title string) (session.Session, error)
	// Delete deletes a session (owner).
	Delete(ctx context.Context, p session.Principal, id session.ID) error
	// Info describes a session, with p's role.
	Info(ctx context.Context, p session.Principal, id session.ID) (session.Session, error)
	// Prompt appends a message (driver) and returns its seq once durable.
	Prompt(ctx context.Context, p session.Principal, id session.ID, text, clientID string) (session.Seq, error)
	// Cancel cancels the running turn (driver).
	Cancel(ctx context.Context, p session.Principal, id session.ID) error
	// Approve answers an approval request (driver).
	Approve(ctx context.Context, p session.Principal, id session.ID, approvalID string, allow bool) error
	// SetMember gives user a role (owner); RoleNone removes it.
	SetMember(ctx context.Context, p session.Principal, id session.ID, user string, role session.Role) error
	// History returns up to limit events after seq after, as the node
	// encoded them, and whether there are more.
	History(ctx context.Context, p session.Principal, id session.ID, after session.Seq, limit int) ([]json.RawMessage, bool, error)
}
