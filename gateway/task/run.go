package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/dlq"
	"github.com/atriumhq/atrium/gateway/forge"
	"github.com/atriumhq/atrium/session"
)

// result is the wrapper's task_result line.
type result struct {
	Changes bool   `json:"changes"`
	Branch  string `json:"branch"`
	Commit  string `json:"commit"`
}

// payload is a dead letter's Payload: the task to run again.
type payload struct {
	Task string `json:"task"`
}

// run runs task t to its end: the turn (retried while it fails for a
// transient reason), then the pull request (likewise). What still fails
// becomes a dead letter.
func (s *Service) run(ctx context.Context, t Task) {
	attempts, err := s.backoff(&t).Do(ctx, func(ctx context.Context) error {
		t.Attempts++
		return s.step(ctx, &t)
	})
	if err == nil {
		return
	}
	if s.ctx.Err() != nil {
		// The server is closing: the task stays as it is; nothing was
		// given up on.
		s.log.Info("task interrupted by shutdown", "task", t.ID)
		return
	}
	s.deadLetter(context.WithoutCancel(ctx), &t, attempts, err)
}

// backoff is how t is retried: its retry policy, or the service's backoff
// of infrastructure failures.
func (s *Service) backoff(t *Task) dlq.Backoff {
	if p := t.Retry; p != nil {
		base, max := p.Delays()
		return dlq.Backoff{Base: base, Max: max, Attempts: p.Attempts}
	}
	return s.cfg.Backoff
}

// turnFailed is the error of a task's turn that failed or timed out: worth
// another try only when t has a retry policy (the agent may do better the
// next time), final otherwise.
func turnFailed(t *Task, err error) error {
	if t.Retry != nil {
		return dlq.Transient(err)
	}
	return err
}

// step does what is left of t: the turn unless the branch is pushed, then
// the pull request. Each part saves t when it is done, so a retry starts
// where the last attempt stopped.
func (s *Service) step(ctx context.Context, t *Task) error {
	if !t.Pushed {
		res, err := s.turn(ctx, t)
		if err != nil {
			return err
		}
		if !res.Changes {
			t.Status, t.Error = StatusNothingToDo, ""
			s.finish(ctx, t)
			return nil
		}
		t.Pushed, t.Commit = true, res.Commit
		if err := s.save(ctx, t); err != nil {
			return dlq.Transient(err)
		}
	}
	return s.openPR(ctx, t)
}

// turn runs one turn of t's session: the git secrets are set, the prompt is
// sent, the turn is followed to its end, and the secrets are deleted again.
func (s *Service) turn(ctx context.Context, t *Task) (result, error) {
	f, err := s.forgeOf(t)
	if err != nil {
		return result{}, err
	}
	if t.Agent != "" {
		return s.agentTurn(ctx, t, f)
	}
	p := t.Principal
	defer func() {
		// The credential lives only while the turn runs. Deleting must
		// happen even when ctx ended.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		for _, name := range []string{SecretToken, SecretUsername} {
			if err := s.cfg.Sessions.DeleteSecret(dctx, p, t.Session, name); err != nil && !errors.Is(err, session.ErrNotFound) {
				s.log.Warn("delete task secret", "task", t.ID, "session", t.Session, "secret", name, "err", err)
			}
		}
	}()
	user := f.GitUsername
	if user == "" {
		user = "x-access-token"
	}
	if err := s.cfg.Sessions.SetSecret(ctx, p, t.Session, SecretUsername, user); err != nil {
		return result{}, fmt.Errorf("set git username: %w", err)
	}
	if err := s.cfg.Sessions.SetSecret(ctx, p, t.Session, SecretToken, f.Token); err != nil {
		return result{}, fmt.Errorf("set git credential: %w", err)
	}
	t.Turns++
	if err := s.save(ctx, t); err != nil {
		return result{}, dlq.Transient(err)
	}
	seq, err := s.cfg.Sessions.Prompt(ctx, p, t.Session, t.Prompt, fmt.Sprintf("%s.%d", t.ID, t.Turns))
	if err != nil {
		return result{}, fmt.Errorf("send the prompt: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.TurnTimeout)
	defer cancel()
	return s.follow(ctx, t, seq)
}

// follow reads t's session's events after the prompt at seq until the turn
// it started has finished, and returns the wrapper's result. Like an SSE
// feed it reads history after the last event it saw; a live event of the
// session wakes it, and it reads again every PollInterval in any case.
func (s *Service) follow(ctx context.Context, t *Task, seq session.Seq) (result, error) {
	wake := make(chan struct{}, 1)
	sub, err := s.cfg.NATS.Subscribe(s.cfg.Subjects.Events(t.Session), func(*nats.Msg) {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return result{}, dlq.Transient(fmt.Errorf("follow session %s: %w", t.Session, err))
	}
	defer sub.Unsubscribe()
	tick := time.NewTicker(s.cfg.PollInterval)
	defer tick.Stop()

	var (
		after       = seq
		turn        int64 // 0 until turn_started of our prompt
		res         *result
		sandboxDown string
	)
	for {
		evs, more, err := s.cfg.Sessions.History(ctx, t.Principal, t.Session, after, 1000)
		if err != nil && !dlq.IsTransient(err) {
			return result{}, fmt.Errorf("read session %s: %w", t.Session, err)
		}
		for _, raw := range evs {
			var ev session.Event
			if err := json.Unmarshal(raw, &ev); err != nil {
				return result{}, fmt.Errorf("decode an event of session %s: %w", t.Session, err)
			}
			after = ev.Seq
			switch ev.Kind {
			case session.KindTurnStarted:
				var d session.TurnStartedData
				if json.Unmarshal(ev.Data, &d) == nil && d.PromptSeq == seq {
					turn = d.Turn
				}
			case session.KindSandbox:
				var d session.SandboxData
				if json.Unmarshal(ev.Data, &d) == nil && d.State == session.SandboxFailed {
					sandboxDown = d.Detail
				}
			case session.KindAgent:
				var d struct {
					Turn int64  `json:"turn"`
					Type string `json:"type"`
					result
				}
				if json.Unmarshal(ev.Data, &d) == nil && turn != 0 && d.Turn == turn && d.Type == ResultType {
					r := d.result
					res = &r
				}
			case session.KindTurnFinished:
				var d session.TurnFinishedData
				if json.Unmarshal(ev.Data, &d) != nil || turn == 0 || d.Turn != turn {
					continue
				}
				if t.Agent != "" {
					return result{}, agentOutcome(t, d, sandboxDown)
				}
				return turnOutcome(t, d, res, sandboxDown)
			}
		}
		if more {
			continue
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return result{}, dlq.Transient(fmt.Errorf("the task's turn did not finish within %v", s.cfg.TurnTimeout))
			}
			return result{}, ctx.Err()
		case <-wake:
		case <-tick.C:
		}
	}
}

// agentTurn runs one turn of agent task t: the repository is put into the
// session's workspace (once), the prompt is sent, the turn is followed to
// its end, and what the agent changed is committed and pushed (agent.go).
func (s *Service) agentTurn(ctx context.Context, t *Task, f *Forge) (result, error) {
	if !t.Seeded {
		if err := s.seed(ctx, t, f); err != nil {
			return result{}, err
		}
		t.Seeded = true
	}
	t.Turns++
	if err := s.save(ctx, t); err != nil {
		return result{}, dlq.Transient(err)
	}
	seq, err := s.cfg.Sessions.Prompt(ctx, t.Principal, t.Session, t.Prompt, fmt.Sprintf("%s.%d", t.ID, t.Turns))
	if err != nil {
		return result{}, fmt.Errorf("send the prompt: %w", err)
	}
	tctx, cancel := context.WithTimeout(ctx, s.cfg.TurnTimeout)
	defer cancel()
	if _, err := s.follow(tctx, t, seq); err != nil {
		return result{}, err
	}
	return s.collect(ctx, t, f)
}

// turnOutcome says what a finished turn means for a task.
func turnOutcome(t *Task, d session.TurnFinishedData, res *result, sandboxDown string) (result, error) {
	switch {
	case d.Status == session.TurnOK && res != nil:
		if res.Changes && res.Branch != t.Branch {
			return result{}, fmt.Errorf("the task wrapper pushed branch %q, not %q", res.Branch, t.Branch)
		}
		return *res, nil
	case d.Status == session.TurnOK:
		return result{}, fmt.Errorf("turn %d of session %s ended without a task result: was the harness replaced?", d.Turn, t.Session)
	case d.Status == session.TurnTimeout:
		return result{}, dlq.Transient(fmt.Errorf("turn %d of session %s timed out", d.Turn, t.Session))
	case sandboxDown != "":
		return result{}, dlq.Transient(fmt.Errorf("the sandbox of session %s failed: %s", t.Session, sandboxDown))
	case d.ExitCode == ExitTransient:
		return result{}, dlq.Transient(fmt.Errorf("turn %d of session %s could not reach the repository (see the session's output)", d.Turn, t.Session))
	case d.Status == session.TurnCancelled:
		return result{}, fmt.Errorf("turn %d of session %s was cancelled", d.Turn, t.Session)
	}
	return result{}, turnFailed(t, fmt.Errorf("turn %d of session %s failed with exit code %d: see the session's output", d.Turn, t.Session, d.ExitCode))
}

// openPR opens t's pull request and records it in the session.
func (s *Service) openPR(ctx context.Context, t *Task) error {
	f, err := s.forgeOf(t)
	if err != nil {
		return err
	}
	repo, _ := parseRepo(t.Repo)
	body := fmt.Sprintf("%s\n\n---\nOpened by an Atrium task for %s: session %s", t.Prompt, t.User, t.Session)
	if s.cfg.PublicURL != "" {
		body = fmt.Sprintf("%s\n\n---\nOpened by an Atrium task for %s: %s/#/sessions/%s", t.Prompt, t.User,
			strings.TrimSuffix(s.cfg.PublicURL, "/"), t.Session)
	}
	opened, err := f.API.OpenPullRequest(ctx, forge.Repo{Owner: repo.owner, Name: repo.name},
		forge.PullRequest{Title: t.Title, Body: body, Head: t.Branch, Base: t.Base})
	if err != nil {
		return err
	}
	t.PRURL = opened.URL
	if err := s.cfg.Sessions.PROpened(ctx, t.Principal, t.Session, session.PROpenedData{URL: opened.URL, Branch: t.Branch}); err != nil {
		s.log.Warn("record pr_opened", "task", t.ID, "session", t.Session, "err", err)
	}
	t.Status, t.Error = StatusPROpened, ""
	s.finish(ctx, t)
	return nil
}

// finish saves t in its final state and notifies its callback URL.
func (s *Service) finish(ctx context.Context, t *Task) {
	ctx = context.WithoutCancel(ctx)
	if err := s.save(ctx, t); err != nil {
		s.log.Warn("save task", "task", t.ID, "err", err)
	}
	s.log.Info("task finished", "task", t.ID, "session", t.Session, "status", t.Status)
	s.audit(ctx, t)
	s.notify(ctx, t)
}

// ActRun is the audit action of a task run that ended: pr_opened,
// nothing_to_do or failed (once per run, and once per retry of its dead
// letter).
const ActRun = "task_run_finished"

// audit records how t's run ended, as its user (Via "task"); never the
// prompt or a credential.
func (s *Service) audit(ctx context.Context, t *Task) {
	if s.cfg.Audit == nil {
		return
	}
	e := audit.Entry{Tenant: t.Tenant, Actor: t.User, Via: "task", Action: ActRun, Outcome: audit.OK,
		Session: string(t.Session), Target: t.ID}
	e.Detail = fmt.Sprintf("%s after %d attempt(s); repo %s, branch %s", t.Status, max(t.Attempts, 1), t.Repo, t.Branch)
	if t.Agent != "" {
		e.Detail += ", agent " + t.Agent
	}
	if t.Status == StatusFailed {
		e.Outcome = audit.Failed
		if t.DeadLetter != "" {
			e.Detail += ", dead letter " + t.DeadLetter
		}
	}
	s.cfg.Audit(ctx, e)
}

// notify posts t's result to its callback URL, if it has one.
func (s *Service) notify(ctx context.Context, t *Task) {
	if t.CallbackURL == "" || s.cfg.Notifier == nil {
		return
	}
	b, _ := json.Marshal(struct {
		Type string `json:"type"`
		Task any    `json:"task"`
	}{"task_result", t.View()})
	if err := s.cfg.Notifier.Notify(ctx, t.CallbackURL, b); err != nil {
		s.log.Warn("notify task callback", "task", t.ID, "err", err)
	}
}

// deadLetter records t as failed with a dead letter holding err.
func (s *Service) deadLetter(ctx context.Context, t *Task, attempts int, err error) {
	reason := err.Error()
	e, perr := s.cfg.DLQ.Put(ctx, dlq.Entry{
		Tenant: t.Tenant, User: t.User, Kind: DLQKind, Ref: t.ID, Reason: reason,
		Permanent: !dlq.IsTransient(err), Attempts: attempts, Payload: mustJSON(payload{Task: t.ID}),
	})
	if perr != nil {
		s.log.Error("put task dead letter", "task", t.ID, "err", perr)
	}
	t.Status, t.Error, t.DeadLetter = StatusFailed, reason, e.ID
	s.log.Warn("task failed", "task", t.ID, "session", t.Session, "attempts", attempts, "err", err)
	s.finish(ctx, t)
}

// retry is the dead-letter handler of kind DLQKind: it runs the task again
// where it stopped, once, and returns the error if it fails again.
func (s *Service) retry(ctx context.Context, e dlq.Entry) error {
	var pl payload
	if err := json.Unmarshal(e.Payload, &pl); err != nil || pl.Task == "" {
		return fmt.Errorf("dead letter %s names no task", e.ID)
	}
	t, err := s.load(ctx, pl.Task)
	if err != nil {
		return err
	}
	if t.Status == StatusPROpened || t.Status == StatusNothingToDo {
		return nil
	}
	t.Status, t.Error = StatusRunning, ""
	t.Attempts++
	if err := s.save(ctx, &t); err != nil {
		return dlq.Transient(err)
	}
	if err := s.step(ctx, &t); err != nil {
		t.Status, t.Error = StatusFailed, err.Error()
		_ = s.save(context.WithoutCancel(ctx), &t)
		s.audit(context.WithoutCancel(ctx), &t)
		return err
	}
	return nil
}

// forgeOf returns the forge of t's repository.
func (s *Service) forgeOf(t *Task) (*Forge, error) {
	repo, err := parseRepo(t.Repo)
	if err != nil {
		return nil, err
	}
	f := s.forges[repo.host]
	if f == nil {
		return nil, fmt.Errorf("no forge is configured for %s any more (tasks.forges)", repo.host)
	}
	return f, nil
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic("task: encode: " + err.Error())
	}
	return b
}
