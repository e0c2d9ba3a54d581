package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/atriumhq/atrium/actor"
	"github.com/atriumhq/atrium/compute/modelgw"
	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/session"
)

// ModelSocketName is the model gateway's Unix socket in the data directory;
// every sandbox of the node has it bound in (compute.Spec.ModelSocket).
const ModelSocketName = "model.sock"

// actModelCall is the audit action of a model call through the gateway.
const actModelCall = "model_call"

// modelNode is the node's model gateway and the server it answers on.
type modelNode struct {
	gw     *modelgw.Gateway
	socket string
	srv    *http.Server
	served chan error
	audits sync.WaitGroup // audit records in flight
}

var _ actor.Models = (*modelgw.Gateway)(nil)

// startModels starts the model gateway on its socket when the config names
// providers; s.models stays nil otherwise.
func (s *Server) startModels() error {
	cfg := s.cfg.Models
	if len(cfg.Providers) == 0 {
		return nil
	}
	m := &modelNode{socket: filepath.Join(s.cfg.DataDir, ModelSocketName), served: make(chan error, 1)}
	var auditLog audit.Recorder = audit.Discard
	if s.nc != nil {
		l, err := audit.New(audit.Config{NATS: s.nc, Replicas: s.cfg.NATS.Replicas})
		if err != nil {
			return fmt.Errorf("model gateway: audit log: %w", err)
		}
		auditLog = l
	}
	if cfg.Ledger == nil && len(cfg.Budgets) > 0 && s.nc != nil {
		// Budgets are counted in NATS KV, shared by every node.
		l, err := newKVLedger(s.nc, s.cfg.NATS.Replicas)
		if err != nil {
			return err
		}
		cfg.Ledger = l
	}
	cfg.Logger = s.cfg.Logger.With("component", "models")
	cfg.Registerer = s.reg
	// The callbacks read s.host, set once startNode has made the host: a
	// call can only come with a token the host issued and activated (under
	// the gateway's lock), which orders the read after the write.
	cfg.OnUsage = func(id session.ID, turn int64, user string, u session.UsageData) {
		if h := s.host; h != nil {
			h.RecordUsage(id, turn, u)
		}
	}
	cfg.OnRefused = func(id session.ID, turn int64, message string) {
		if h := s.host; h != nil {
			h.SayError(id, turn, session.CodeNotFound, message)
		}
	}
	cfg.OnOverBudget = func(id session.ID, turn int64, reason string) {
		if h := s.host; h != nil {
			h.EndTurn(id, turn, session.CodeTooManyRequests, "model "+reason)
		}
	}
	cfg.Audit = func(e modelgw.AuditEntry) {
		// Recorded in the background: the answer's end waits for nothing.
		m.audits.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			outcome := audit.OK
			if e.Status >= 400 {
				outcome = audit.Failed
			}
			err := auditLog.Record(ctx, audit.Entry{Time: e.Time, Tenant: e.Tenant, Actor: e.User, Via: "model_gateway",
				Action: actModelCall, Session: string(e.Session), Target: e.Provider + "/" + e.Model, Outcome: outcome,
				Detail: fmt.Sprintf("turn %d, status %d, input %d, output %d, cached %d tokens, $%.6f, %s",
					e.Turn, e.Status, e.Usage.InputTokens, e.Usage.OutputTokens, e.Usage.CachedTokens, e.Usage.CostUSD,
					e.Duration.Round(time.Millisecond)),
				Remote: "sandbox"})
			if err != nil {
				s.cfg.Logger.Warn("model call not audited", "session", string(e.Session), "error", err.Error())
			}
		})
	}
	gw, err := modelgw.New(cfg)
	if err != nil {
		return err
	}
	m.gw = gw
	if err := os.Remove(m.socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("model gateway: remove stale socket: %w", err)
	}
	ln, err := net.Listen("unix", m.socket)
	if err != nil {
		return fmt.Errorf("model gateway: listen on %s (a data directory with a shorter path helps if it is too long): %w", m.socket, err)
	}
	// Only the node's user (and its sandboxes, which run as that user)
	// may connect.
	if err := os.Chmod(m.socket, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("model gateway: %w", err)
	}
	m.srv = &http.Server{Handler: gw, ReadHeaderTimeout: 30 * time.Second}
	go func() { m.served <- m.srv.Serve(ln) }()
	s.models = m
	s.cfg.Logger.Info("model gateway serving sandboxes", "socket", m.socket, "providers", len(cfg.Providers))
	return nil
}

// modelSocket is the socket sandboxes get; "" without a gateway.
func (s *Server) modelSocket() string {
	if s.models == nil {
		return ""
	}
	return s.models.socket
}

// actorModels is the host's Models: nil (no interface value holding a nil
// pointer) without a gateway.
func (s *Server) actorModels() actor.Models {
	if s.models == nil {
		return nil
	}
	return s.models.gw
}

// ModelGateway is the node's model gateway; nil when no provider is
// configured.
func (s *Server) ModelGateway() *modelgw.Gateway {
	if s.models == nil {
		return nil
	}
	return s.models.gw
}

// closeModels stops the model gateway: answers in progress end.
func (s *Server) closeModels(ctx context.Context) error {
	m := s.models
	if m == nil {
		return nil
	}
	s.models = nil
	err := m.srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		err = m.srv.Close()
	}
	if serr := <-m.served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	m.audits.Wait()
	if rerr := os.Remove(m.socket); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	if err != nil {
		return fmt.Errorf("model gateway: %w", err)
	}
	return nil
}
