package actor

import (
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestSession_PROpened checks OpPROpened: a driver records a pr_opened
// event by itself; a viewer may not; a bad URL or branch is a bad_request
// that records nothing.
func TestSession_PROpened(t *testing.T) {
	e := newEnv(t)
	id := e.create("olive", shell())
	owner := session.Principal{User: "olive"}
	if _, code := e.cmdAs(id, owner, session.Command{Op: session.OpMember, User: "val", Role: session.RoleViewer}); code != "" {
		t.Fatalf("add viewer: %s", code)
	}
	pr := &session.PROpenedData{URL: "https://github.com/acme/w/pull/7", Branch: "atrium/task_1"}
	for name, tc := range map[string]struct {
		p    session.Principal
		pr   *session.PROpenedData
		want session.Code
	}{
		"viewer":     {session.Principal{User: "val"}, pr, session.CodeForbidden},
		"no pr":      {owner, nil, session.CodeBadRequest},
		"bad url":    {owner, &session.PROpenedData{URL: "javascript:alert(1)", Branch: "b"}, session.CodeBadRequest},
		"bad branch": {owner, &session.PROpenedData{URL: pr.URL, Branch: "a b"}, session.CodeBadRequest},
	} {
		if _, code := e.cmdAs(id, tc.p, session.Command{Op: session.OpPROpened, PR: tc.pr}); code != tc.want {
			t.Errorf("%s: code %q, want %q", name, code, tc.want)
		}
	}
	rep, code := e.cmdAs(id, owner, session.Command{Op: session.OpPROpened, PR: pr})
	if code != "" || rep.Seq == 0 {
		t.Fatalf("pr_opened: %q, %+v", code, rep)
	}
	var got []session.Event
	for _, ev := range decode(t, e.history(id, "olive")) {
		if ev.Kind == session.KindPROpened {
			got = append(got, ev)
		}
	}
	if len(got) != 1 || got[0].Seq != rep.Seq || got[0].By != "olive" || data[session.PROpenedData](t, got[0]) != *pr {
		t.Fatalf("pr_opened events: %s", summarize(got))
	}
}
