package channel

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/atriumhq/atrium/session"
)

// Tasks starts repository tasks for "task" commands and mentions. The
// gateway implements it with the task service behind POST /v1/tasks, so
// the forge's permission check comes first and a refusal leaves no session.
type Tasks interface {
	// StartTask starts a task as p and returns its session. The session
	// is bound to a thread only after it returns: nothing is lost, since a
	// new binding renders the session's events from its first one.
	// ErrNoTasks means tasks are not set up on this server.
	StartTask(ctx context.Context, p session.Principal, req TaskRequest) (session.ID, error)
}

// TaskRequest is what a person asked for with
// "task REPO-URL [--base BRANCH] [--agent NAME] PROMPT".
type TaskRequest struct {
	Repo   string
	Base   string
	Prompt string
	// Agent names the coding agent that works on the prompt (a session
	// running it); empty: the prompt is a shell command.
	Agent string
}

// DefaultTaskBase is the base branch of a task that names none.
const DefaultTaskBase = "main"

// ErrNoTasks is returned by Tasks.StartTask when the server has no
// repository tasks configured.
var ErrNoTasks = errors.New("channel: repository tasks are not set up")

// taskUsage is the reminder of how "task" is typed.
func taskUsage(prefix string) string {
	return fmt.Sprintf("Tell me the repository and what to do: “%stask https://github.com/acme/widgets --base main fix the flaky test”. "+
		"--base is the branch the pull request merges into (default %s); --agent claude has a coding agent do the work.", prefix, DefaultTaskBase)
}

// isTask reports whether a mention asks for a task: "task" followed by an
// http(s) URL. Anything else is a prompt for a session like any other.
func isTask(text string) bool {
	verb, rest := cutWord(text)
	repo, _ := cutWord(rest)
	repo = unlink(repo)
	return strings.EqualFold(verb, "task") && (strings.HasPrefix(repo, "https://") || strings.HasPrefix(repo, "http://"))
}

// parseTask reads "REPO-URL [--base BRANCH] [--agent NAME] PROMPT" (the
// options in any order, also as --base=BRANCH); ok false means args do not
// have that shape.
func parseTask(args string) (TaskRequest, bool) {
	repo, rest := cutWord(args)
	req := TaskRequest{Repo: unlink(repo), Base: DefaultTaskBase}
	for {
		w, after := cutWord(rest)
		name, value, inline := strings.Cut(w, "=")
		var dst *string
		switch name {
		case "--base":
			dst = &req.Base
		case "--agent":
			dst = &req.Agent
		}
		if dst == nil {
			break
		}
		if !inline {
			value, after = cutWord(after)
		}
		*dst, rest = value, after
	}
	req.Prompt = strings.TrimSpace(rest)
	return req, req.Repo != "" && req.Base != "" && req.Prompt != "" && !strings.HasPrefix(req.Agent, "-")
}

// cutWord returns the first word of s and the rest, without the spaces
// between them.
func cutWord(s string) (word, rest string) {
	s = strings.TrimLeft(s, " \t\n")
	i := strings.IndexAny(s, " \t\n")
	if i < 0 {
		return s, ""
	}
	return s[:i], strings.TrimLeft(s[i:], " \t\n")
}

// unlink undoes a chat platform's link markup around a URL: Slack sends
// "<https://github.com/acme/widgets>" or "<https://…|label>".
func unlink(w string) string {
	if strings.HasPrefix(w, "<") && strings.HasSuffix(w, ">") {
		w, _, _ = strings.Cut(w[1:len(w)-1], "|")
	}
	return w
}

// startTask starts a task as p and returns its session, or the sentence
// that tells the person why not (reply != ""). An error is worth retrying.
func (s *Service) startTask(ctx context.Context, p session.Principal, req TaskRequest) (id session.ID, reply string, err error) {
	if s.cfg.Tasks == nil {
		return "", noTasks, nil
	}
	id, err = s.cfg.Tasks.StartTask(ctx, p, req)
	var e *session.Error
	switch {
	case err == nil:
		return id, "", nil
	case errors.Is(err, ErrNoTasks):
		return "", noTasks, nil
	case errors.As(err, &e):
		// The task service's sentences say what to do, also when the
		// forge did not answer; nothing was started.
		return "", "Atrium didn't start the task: " + e.Message + ".", nil
	}
	return "", "", err
}

const noTasks = "Repository tasks are not set up on this Atrium: an operator adds the forges under tasks.forges (see “Repository tasks” in docs/automation.md)."

// commandTask starts a task for "task REPO-URL [--base BRANCH] PROMPT" and
// binds its session to a thread: a new one where the platform opens
// threads, else the command's.
func (s *Service) commandTask(ctx context.Context, ch Channel, c Command, p session.Principal, args string) (string, error) {
	if s.cfg.Tasks == nil {
		return noTasks, nil
	}
	req, ok := parseTask(args)
	if !ok {
		return taskUsage(c.Prefix), nil
	}
	id, reply, err := s.startTask(ctx, p, req)
	if err != nil || reply != "" {
		return reply, err
	}
	th := c.Thread
	if op, ok := ch.(Opener); ok {
		m := Message{Text: fmt.Sprintf("🛠 %s started a repository task on %s: %s", orNothing(c.User.Name, "Someone"), req.Repo, title(req.Prompt))}
		if l := s.link(id); l != "" {
			m.Link = &Link{Text: "Open in Atrium", URL: l}
		}
		th, err = op.Open(ctx, c.Thread, m)
		if err != nil {
			// The task runs all the same; only its thread is missing.
			s.log.Warn("channel: open the thread of a task", "session", string(id), "err", err)
			return strings.TrimSpace(fmt.Sprintf("Started the task in session %s, but I couldn't post in this channel: invite me to it to see the pull request here. %s",
				id, s.link(id))), nil
		}
	}
	if _, err := s.st.bindThread(ctx, th, id, p.User, p.Tenant, true); err != nil {
		// Not retried: that would start a second task.
		s.log.Warn("channel: bind the thread of a task", "session", string(id), "err", err)
		return strings.TrimSpace(fmt.Sprintf("Started the task in session %s, but I couldn't attach it to a thread: follow it in the web UI. %s", id, s.link(id))), nil
	}
	s.kick(id)
	reply = fmt.Sprintf("Started a task on %s (base %s) in session %s; its pull request will be posted in the thread.", req.Repo, req.Base, id)
	if l := s.link(id); l != "" {
		reply += " " + l
	}
	return reply, nil
}

// receiveTask starts a task for a mention "task REPO-URL …" in a thread
// that has no session yet, and binds its session to the thread.
func (s *Service) receiveTask(ctx context.Context, ch Channel, in Incoming, p session.Principal) error {
	bound, err := s.st.sessionOf(ctx, in.Thread)
	if err != nil {
		return err
	}
	if bound != "" {
		s.tell(ch, in.Thread, in.User, fmt.Sprintf("This thread already belongs to session %s. Start the task in a new thread: mention me there with “task REPO-URL what to do”.", bound))
		return nil
	}
	_, rest := cutWord(in.Text)
	req, ok := parseTask(rest)
	if !ok {
		s.tell(ch, in.Thread, in.User, taskUsage("@Atrium "))
		return nil
	}
	id, reply, err := s.startTask(ctx, p, req)
	if err != nil {
		return err
	}
	if reply != "" {
		s.tell(ch, in.Thread, in.User, reply)
		return nil
	}
	bound, err = s.st.bindThread(ctx, in.Thread, id, p.User, p.Tenant, false)
	if err != nil {
		// Not an error for the platform: a redelivery would start a second
		// task.
		s.log.Warn("channel: bind the thread of a task", "session", string(id), "err", err)
		s.tell(ch, in.Thread, in.User, strings.TrimSpace(fmt.Sprintf("Started the task in session %s, but I couldn't attach it to this thread: follow it in the web UI. %s", id, s.link(id))))
		return nil
	}
	if bound != id {
		s.log.Warn("channel: a task's thread was bound to another session meanwhile", "session", string(id), "thread_session", string(bound))
	}
	s.kick(id)
	return nil
}
