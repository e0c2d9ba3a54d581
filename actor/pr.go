package actor

import (
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/session"
)

// Limits of a pr_opened event's fields.
const (
	maxPRURLBytes    = 2048
	maxPRBranchBytes = 255
)

// opPROpened records a pull request opened for the session's work (driver):
// a pr_opened {url,branch} event by the caller, answered once durable. The
// gateway's repository tasks send it after the forge opened the request.
func (s *sessionActor) opPROpened(msg *nats.Msg, user string, c *session.Command) {
	pr := c.PR
	if pr == nil {
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "pr_opened needs pr: {url, branch}")))
		return
	}
	u, err := url.Parse(pr.URL)
	switch {
	case len(pr.URL) > maxPRURLBytes || err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "":
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "pr_opened: url must be an http(s) URL of at most %d bytes", maxPRURLBytes)))
		return
	case pr.Branch == "" || len(pr.Branch) > maxPRBranchBytes || !utf8.ValidString(pr.Branch) || strings.ContainsAny(pr.Branch, " \n\r\t"):
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "pr_opened: branch must be a branch name of at most %d bytes", maxPRBranchBytes)))
		return
	}
	data := mustMarshal(session.PROpenedData{URL: pr.URL, Branch: pr.Branch})
	var seq session.Seq
	seq = s.events.emit(session.KindPROpened, user, data, func(err error) {
		if err != nil {
			respond(msg, errorReply(err))
			return
		}
		respond(msg, session.Reply{Seq: seq})
	})
}
