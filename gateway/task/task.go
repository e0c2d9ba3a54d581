// Package task runs repository tasks (docs/automation.md): a prompt worked on
// in a fresh session whose sandbox clones a repository, and a pull request
// opened through the repository's forge (GitHub, Gitea, Forgejo) when the
// work changed something.
//
// A task runs as the user who asked for it. Before any session exists the
// user's permission on the repository is checked with the forge (write or
// better). The session's harness is a wrapper (wrapper.go) that clones the
// repository, runs the inner harness, and commits and pushes a branch; the
// git credential is a session secret only while the turn runs. The service
// follows the turn in the session's events and opens the pull request,
// recording pr_opened in the session. Transient failures are retried with
// backoff; what still fails becomes a dead letter (gateway/dlq, kind "task")
// that `atrium dlq retry` runs again. Task records live in the NATS KV
// bucket "<prefix>_tasks".
package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/dlq"
	"github.com/atriumhq/atrium/gateway/forge"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
)

// DLQKind is the kind of the dead letters of tasks.
const DLQKind = "task"

// Defaults of Config.
const (
	// DefaultTurnTimeout bounds how long a task's turn is followed.
	DefaultTurnTimeout = time.Hour
	// DefaultPollInterval is how often a followed session's history is
	// read when no event wakes the follower sooner.
	DefaultPollInterval = 2 * time.Second
)

// noreplyPrefix makes commit emails for users whose name is not an email
// address: "<forge login>@users.noreply.<forge host>".
const noreplyPrefix = "users.noreply."

// maxShellPrompt is the longest prompt the shell harness runs: the wrapper
// passes it in one environment variable, which Linux limits to 128 KiB.
const maxShellPrompt = 128<<10 - 64

// Limits of a request.
const (
	MaxRepoBytes   = 2048
	MaxBaseBytes   = 255
	MaxCallbackURL = 2048
)

// Statuses of a task.
const (
	StatusRunning     = "running"       // the turn runs, or the pull request is being opened
	StatusPROpened    = "pr_opened"     // done: PRURL is set
	StatusNothingToDo = "nothing_to_do" // done: the work changed nothing
	StatusFailed      = "failed"        // a dead letter holds it (DeadLetter)
)

// Forge is a forge the service knows, by the host of repository URLs.
type Forge struct {
	// Host is the host (with :port if not the default) of repository URLs
	// on this forge, e.g. "github.com".
	Host string
	// Type is forge.TypeGitHub or forge.TypeGitea.
	Type string
	// API is the forge's client.
	API forge.Forge
	// Token is the git credential given to task sandboxes to clone and
	// push (as a session secret while the turn runs).
	Token string
	// GitUsername goes with Token over HTTPS; default "x-access-token".
	GitUsername string
	// Users maps Atrium users to their logins on the forge, for the
	// permission check. A user not in it cannot run tasks on this forge.
	Users map[string]string
}

// Sessions is what tasks need from the gateway: commands on sessions made as
// a principal, with the gateway's role checks and audit entries. Errors are
// *session.Error values.
type Sessions interface {
	// Create makes a session owned by p with the given harness and own
	// egress allowlist.
	Create(ctx context.Context, p session.Principal, title string, h session.Harness, egress []string) (session.Session, error)
	// SetSecret sets a secret of the session (owner); DeleteSecret removes
	// it (not_found if it is not set).
	SetSecret(ctx context.Context, p session.Principal, id session.ID, name, value string) error
	DeleteSecret(ctx context.Context, p session.Principal, id session.ID, name string) error
	// Prompt appends a message (driver) and returns its seq once durable.
	Prompt(ctx context.Context, p session.Principal, id session.ID, text, clientID string) (session.Seq, error)
	// History returns events after seq after, as the node encoded them,
	// and whether there are more.
	History(ctx context.Context, p session.Principal, id session.ID, after session.Seq, limit int) ([]json.RawMessage, bool, error)
	// PROpened records a pr_opened event in the session (driver).
	PROpened(ctx context.Context, p session.Principal, id session.ID, pr session.PROpenedData) error
	// PutArchive unpacks the tar.gz body into folder dir of the session's
	// workspace ("" for the whole), whole or not at all (driver); it
	// waits for the running turn.
	PutArchive(ctx context.Context, p session.Principal, id session.ID, dir string, body io.Reader) error
	// GetArchive writes a tar.gz of folder dir of the session's workspace
	// ("" for the whole) to w (reader).
	GetArchive(ctx context.Context, p session.Principal, id session.ID, dir string, w io.Writer) error
}

// Notifier delivers a task's result to its callback_url, signed; nil
// refuses callback URLs.
type Notifier interface {
	Notify(ctx context.Context, callbackURL string, body []byte) error
}

// Config configures a Service. NATS, Sessions and DLQ are required.
type Config struct {
	NATS     *nats.Conn
	Subjects session.Subjects
	Sessions Sessions
	DLQ      *dlq.Queue
	// Forges are the forges tasks may work on.
	Forges []Forge
	// PublicURL is the gateway's URL, for links in pull requests.
	PublicURL string
	// Notifier delivers results to callback URLs; nil: callback_url is
	// refused.
	Notifier Notifier
	// Backoff retries transient failures; zero fields use dlq's defaults.
	// A task's own retry policy (Request.Retry) replaces it for the task.
	Backoff dlq.Backoff
	// Audit records each run's end (ActRun) in the audit log; nil: runs
	// are only logged.
	Audit func(ctx context.Context, e audit.Entry)
	// TurnTimeout bounds a turn; default DefaultTurnTimeout.
	TurnTimeout time.Duration
	// PollInterval: see DefaultPollInterval.
	PollInterval time.Duration
	// Replicas is the JetStream replica count of the tasks bucket;
	// default 1.
	Replicas int
	// Logger receives the service's logs; default slog.Default().
	Logger *slog.Logger
}

// Request is the body of POST /v1/tasks.
type Request = api.TaskRequest

// Task is a task's record, as GET /v1/tasks/{id} shows it.
type Task struct {
	ID          string     `json:"id"`
	Tenant      string     `json:"tenant,omitempty"`
	User        string     `json:"user"`
	Repo        string     `json:"repo"`
	Base        string     `json:"base"`
	Title       string     `json:"title"`
	Session     session.ID `json:"session"`
	Branch      string     `json:"branch"`
	Status      string     `json:"status"`
	Commit      string     `json:"commit,omitempty"`
	PRURL       string     `json:"pr_url,omitempty"`
	Error       string     `json:"error,omitempty"`
	DeadLetter  string     `json:"dead_letter,omitempty"`
	CallbackURL string     `json:"callback_url,omitempty"`
	CreatedAt   time.Time  `json:"created_at"`
	UpdatedAt   time.Time  `json:"updated_at"`

	// Agent names the ACP agent the task's session runs (`atrium task run
	// --agent`); empty for a harness run inside the task wrapper.
	Agent string `json:"agent,omitempty"`
	// Retry is the task's retry policy: a failed or timed-out turn is
	// tried again under it. Attempts counts the tries made.
	Retry    *api.RetryPolicy `json:"retry,omitempty"`
	Attempts int              `json:"attempts,omitempty"`

	// Kept for retries, not shown.
	Prompt    string            `json:"prompt"`
	Email     string            `json:"email,omitempty"`  // commit author's email
	Seeded    bool              `json:"seeded,omitempty"` // an agent task's repository is in its workspace
	Principal session.Principal `json:"principal"`
	Pushed    bool              `json:"pushed,omitempty"` // the branch holds the work; only the PR is missing
	Turns     int               `json:"turns,omitempty"`  // prompts sent, for client ids
}

// View is what the API shows of t (GET /v1/tasks/{id}).
func (t Task) View() api.Task {
	return api.Task{ID: t.ID, User: t.User, Repo: t.Repo, Base: t.Base, Title: t.Title, Session: t.Session,
		Branch: t.Branch, Agent: t.Agent, Status: t.Status, Commit: t.Commit, PRURL: t.PRURL, Error: t.Error,
		DeadLetter: t.DeadLetter, CallbackURL: t.CallbackURL, Retry: t.Retry, Attempts: t.Attempts,
		CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt}
}

// Service runs tasks. Create it with New and Close it.
type Service struct {
	cfg    Config
	log    *slog.Logger
	kv     jetstream.KeyValue
	forges map[string]*Forge

	ctx    context.Context
	cancel context.CancelCauseFunc
	runs   sync.WaitGroup
	mu     sync.Mutex
	closed bool // guarded by mu
}

// New opens the task bucket and registers the retry of dead letters of kind
// DLQKind.
func New(ctx context.Context, cfg Config) (*Service, error) {
	switch {
	case cfg.NATS == nil:
		return nil, errors.New("task: config needs a NATS connection")
	case cfg.Sessions == nil:
		return nil, errors.New("task: config needs Sessions")
	case cfg.DLQ == nil:
		return nil, errors.New("task: config needs a dead-letter queue")
	}
	if cfg.TurnTimeout <= 0 {
		cfg.TurnTimeout = DefaultTurnTimeout
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Service{cfg: cfg, log: cfg.Logger, forges: map[string]*Forge{}}
	for i := range cfg.Forges {
		f := &cfg.Forges[i]
		host := strings.ToLower(f.Host)
		if host == "" || f.API == nil || f.Token == "" {
			return nil, fmt.Errorf("task: forge %d needs a host, an API client and a token", i)
		}
		if _, dup := s.forges[host]; dup {
			return nil, fmt.Errorf("task: two forges for host %s", host)
		}
		s.forges[host] = f
	}
	js, err := jetstream.New(cfg.NATS)
	if err != nil {
		return nil, fmt.Errorf("task: jetstream: %w", err)
	}
	prefix := cfg.Subjects.Prefix
	if prefix == "" {
		prefix = session.DefaultPrefix
	}
	s.kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: prefix + "_tasks", Description: "Atrium repository tasks",
		Replicas: max(cfg.Replicas, 1)})
	if err != nil {
		return nil, fmt.Errorf("task: open bucket %s_tasks: %w", prefix, err)
	}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	cfg.DLQ.Handle(DLQKind, s.retry)
	return s, nil
}

// Close stops the running tasks (they stay in their last state, and their
// dead letters can be retried) and waits for them, or until ctx is done.
// It is safe to call more than once.
func (s *Service) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel(errors.New("task: service closed"))
	done := make(chan struct{})
	go func() { s.runs.Wait(); close(done) }() // owned: ends when the runs do.
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("task: close: %w", ctx.Err())
	}
}

// repoRef is a parsed repository URL.
type repoRef struct {
	url   string // as given, without a trailing slash
	host  string // lowercase, with :port if given
	owner string
	name  string
}

var refName = regexp.MustCompile(`^[A-Za-z0-9._/-]+$`)

// parseRepo checks a repository URL: http(s)://HOST[:PORT]/OWNER/NAME[.git],
// with no credentials in it.
func parseRepo(raw string) (repoRef, error) {
	bad := func(why string) (repoRef, error) {
		return repoRef{}, session.Errorf(session.CodeBadRequest, "repo %q %s: give the repository's https URL, e.g. https://github.com/acme/widgets", raw, why)
	}
	if raw == "" {
		return repoRef{}, session.Errorf(session.CodeBadRequest, "repo is required: the repository's https URL, e.g. https://github.com/acme/widgets")
	}
	if len(raw) > MaxRepoBytes {
		return bad("is too long")
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return bad("is not a URL")
	case u.Scheme != "https" && u.Scheme != "http":
		return bad("is not an http(s) URL")
	case u.User != nil:
		return bad("holds credentials (the forge's token is used)")
	case u.Host == "" || u.RawQuery != "" || u.Fragment != "":
		return bad("is not a repository URL")
	}
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	if len(parts) != 2 || parts[0] == "" || parts[1] == "" {
		return bad("does not name OWNER/REPOSITORY")
	}
	name := strings.TrimSuffix(parts[1], ".git")
	for _, p := range []string{parts[0], name} {
		if !refName.MatchString(p) || strings.Contains(p, "/") || p == "." || p == ".." {
			return bad("has an unusual owner or repository name")
		}
	}
	return repoRef{url: strings.TrimSuffix(raw, "/"), host: strings.ToLower(u.Host), owner: parts[0], name: name}, nil
}

// validBase checks a base branch name the way git check-ref-format would,
// roughly.
func validBase(b string) error {
	if b == "" {
		return session.Errorf(session.CodeBadRequest, "base is required: the branch the pull request merges into, e.g. main")
	}
	if len(b) > MaxBaseBytes || !refName.MatchString(b) || strings.Contains(b, "..") || strings.HasPrefix(b, "-") ||
		strings.HasPrefix(b, "/") || strings.HasSuffix(b, "/") || strings.HasSuffix(b, ".lock") {
		return session.Errorf(session.CodeBadRequest, "base %q is not a branch name", b)
	}
	return nil
}

// Start checks a request and p's permission on the repository, creates the
// task's session and starts the task. Nothing exists yet when the check
// fails: a user without write access gets forbidden before any session or
// sandbox is made.
func (s *Service) Start(ctx context.Context, p session.Principal, req Request) (Task, error) {
	repo, err := parseRepo(req.Repo)
	if err != nil {
		return Task{}, err
	}
	if err := validBase(req.Base); err != nil {
		return Task{}, err
	}
	switch {
	case strings.TrimSpace(req.Prompt) == "":
		return Task{}, session.Errorf(session.CodeBadRequest, "prompt is required: what the agent should do in the repository")
	case len(req.Prompt) > session.MaxTextBytes:
		return Task{}, session.Errorf(session.CodePayloadTooLarge, "prompt is longer than %d bytes", session.MaxTextBytes)
	}
	title := strings.TrimSpace(req.Title)
	if title == "" {
		title = firstLine(req.Prompt)
	}
	if len(title) > session.MaxTitleBytes-len("Task: ") {
		title = truncate(title, session.MaxTitleBytes-len("Task: "))
	}
	if req.Agent != "" {
		if req.Harness.Agent != "" && req.Harness.Agent != req.Agent {
			return Task{}, session.Errorf(session.CodeBadRequest, "agent %q and harness.agent %q differ: give one", req.Agent, req.Harness.Agent)
		}
		req.Harness.Agent = req.Agent
	}
	if err := req.Harness.Validate(); err != nil {
		return Task{}, err
	}
	if req.Harness.Agent == "" && len(req.Harness.Command) == 0 && len(req.Prompt) > maxShellPrompt {
		return Task{}, session.Errorf(session.CodePayloadTooLarge,
			"the shell harness runs prompts of at most %d bytes; give a command harness for longer ones", maxShellPrompt)
	}
	if req.Harness.Template != "" && req.Harness.Template != session.DefaultTemplate {
		return Task{}, session.Errorf(session.CodeBadRequest,
			`a task's harness is "shell" (the default) or {"command":[…]}; template %q cannot run inside the task wrapper`, req.Harness.Template)
	}
	if req.Retry != nil {
		if err := req.Retry.Validate(); err != nil {
			return Task{}, err
		}
	}
	if req.CallbackURL != "" {
		u, err := url.Parse(req.CallbackURL)
		switch {
		case s.cfg.Notifier == nil:
			return Task{}, session.Errorf(session.CodeBadRequest, "callback_url is not enabled on this server (tasks.callback_secret_env is not set)")
		case len(req.CallbackURL) > MaxCallbackURL || err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "":
			return Task{}, session.Errorf(session.CodeBadRequest, "callback_url must be an http(s) URL")
		}
	}
	if !p.Limit(session.RoleOwner).AtLeast(session.RoleDriver) {
		return Task{}, session.Errorf(session.CodeForbidden, "this credential is limited to the %s role: it cannot start tasks", p.Cap)
	}
	f := s.forges[repo.host]
	if f == nil {
		return Task{}, session.Errorf(session.CodeBadRequest, "no forge is configured for %s: the operator adds it under tasks.forges", repo.host)
	}
	login := f.Users[p.User]
	if login == "" {
		return Task{}, session.Errorf(session.CodeForbidden,
			"your user %s has no %s login configured: ask the operator to map it under tasks.forges[].users", p.User, repo.host)
	}
	perm, err := f.API.Permission(ctx, forge.Repo{Owner: repo.owner, Name: repo.name}, login)
	if err != nil {
		if dlq.IsTransient(err) {
			return Task{}, withCause(session.Errorf(session.CodeUnavailable, "%s did not answer the permission check: try again shortly", repo.host), err)
		}
		return Task{}, withCause(session.Errorf(session.CodeUnavailable,
			"%s refused the permission check on %s/%s (%v): the operator should check the forge's token in tasks.forges", repo.host, repo.owner, repo.name, err), err)
	}
	if !perm.CanPush() {
		return Task{}, session.Errorf(session.CodeForbidden,
			"%s (%s on %s) has %s access to %s/%s: tasks need write access, because they push a branch",
			p.User, login, repo.host, perm, repo.owner, repo.name)
	}

	s.mu.Lock()
	closed := s.closed
	if !closed {
		s.runs.Add(1)
	}
	s.mu.Unlock()
	if closed {
		return Task{}, session.Errorf(session.CodeUnavailable, "the server is shutting down: try again shortly")
	}
	started := false
	defer func() {
		if !started {
			s.runs.Done()
		}
	}()

	now := time.Now().UTC()
	p.Expires = time.Time{}
	t := Task{
		ID: "task_" + strings.TrimPrefix(string(session.NewID()), "s_"), Tenant: p.Tenant, User: p.User, Repo: repo.url, Base: req.Base,
		Title: title, Status: StatusRunning, CallbackURL: req.CallbackURL, CreatedAt: now, UpdatedAt: now,
		Prompt: req.Prompt, Principal: p, Retry: req.Retry,
	}
	t.Branch = "atrium/" + t.ID
	email := p.User
	if !strings.Contains(email, "@") {
		email = login + "@" + noreplyPrefix + strings.Split(repo.host, ":")[0]
	}
	t.Email = email
	// A harness runs inside the wrapper, which clones and pushes from the
	// sandbox (so the repository's host is its egress); an agent's
	// workspace is seeded and collected here (agent.go), and its sandbox
	// needs no way to the forge.
	h, egress := wrapperHarness(repo.url, req.Base, t.Branch, p.User, email, title, req.Harness), []string{repo.host}
	if req.Harness.Agent != "" {
		t.Agent = req.Harness.Agent
		h, egress = session.Harness{Agent: t.Agent}, nil
	}
	sess, err := s.cfg.Sessions.Create(ctx, p, "Task: "+title, h, egress)
	if err != nil {
		return Task{}, err
	}
	t.Session = sess.ID
	if err := s.save(ctx, &t); err != nil {
		return Task{}, session.Errorf(session.CodeUnavailable, "the task could not be recorded: try again shortly")
	}
	started = true
	go func() { // owned: Close waits for s.runs.
		defer s.runs.Done()
		s.run(s.ctx, t)
	}()
	return t, nil
}

// Get returns task id if p may see it: its user, or an admin of its tenant.
func (s *Service) Get(ctx context.Context, p session.Principal, id string) (Task, error) {
	t, err := s.load(ctx, id)
	if err != nil {
		return Task{}, err
	}
	if t.Tenant != p.Tenant || (t.User != p.User && !p.Admin) {
		return Task{}, session.Errorf(session.CodeNotFound, "task %s not found", id)
	}
	return t, nil
}

var taskID = regexp.MustCompile(`^task_[A-Za-z0-9_-]{1,100}$`)

func (s *Service) load(ctx context.Context, id string) (Task, error) {
	if !taskID.MatchString(id) {
		return Task{}, session.Errorf(session.CodeNotFound, "task %s not found", id)
	}
	e, err := s.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Task{}, session.Errorf(session.CodeNotFound, "task %s not found", id)
	}
	if err != nil {
		return Task{}, withCause(session.Errorf(session.CodeUnavailable, "tasks are unavailable: try again shortly"), err)
	}
	var t Task
	if err := json.Unmarshal(e.Value(), &t); err != nil {
		return Task{}, fmt.Errorf("decode task %s: %w", id, err)
	}
	return t, nil
}

func (s *Service) save(ctx context.Context, t *Task) error {
	t.UpdatedAt = time.Now().UTC()
	b, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("encode task %s: %w", t.ID, err)
	}
	if _, err := s.kv.Put(ctx, t.ID, b); err != nil {
		return fmt.Errorf("save task %s: %w", t.ID, err)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }

// causeError is a wire error that keeps its cause for logs.
type causeError struct {
	wire  *session.Error
	cause error
}

func withCause(wire *session.Error, cause error) error { return &causeError{wire: wire, cause: cause} }

func (e *causeError) Error() string   { return e.wire.Error() + ": " + e.cause.Error() }
func (e *causeError) Unwrap() []error { return []error{e.wire, e.cause} }
