package task

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/atriumhq/atrium/session"
)

// List returns the tasks p may see (its own, or all of its tenant's for a
// tenant admin, as Get), newest first; a non-empty sess keeps only the
// tasks of that session.
func (s *Service) List(ctx context.Context, p session.Principal, sess session.ID) ([]Task, error) {
	keys, err := s.kv.ListKeys(ctx)
	if err != nil {
		return nil, withCause(session.Errorf(session.CodeUnavailable, "tasks are unavailable: try again shortly"), err)
	}
	out := []Task{}
	seen := map[string]bool{} // a key may be listed twice while tasks are written
	for k := range keys.Keys() {
		if seen[k] {
			continue
		}
		seen[k] = true
		t, err := s.load(ctx, k)
		if errors.Is(err, session.ErrNotFound) {
			continue // deleted meanwhile, or not a task's key
		}
		if err != nil {
			_ = keys.Stop()
			return nil, err
		}
		if t.Tenant != p.Tenant || (t.User != p.User && !p.Admin) || (sess != "" && t.Session != sess) {
			continue
		}
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b Task) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}
