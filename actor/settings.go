package actor

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/egress"
	"github.com/atriumhq/atrium/session"
)

// opSettings changes the session's title and settings (owner): the change
// is kept in the Meta, a new title is written to the catalog before the
// reply (so that GET /v1/sessions shows it), and a permission mode takes
// effect the next time the agent is started (a running agent keeps its
// mode). A rename is not an event: the title is metadata, like egress.
func (s *sessionActor) opSettings(msg *nats.Msg, who session.Principal, c *session.Command) {
	p := c.Settings
	if p.IsEmpty() {
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest,
			`settings: give "title" or "settings":{"harness","agent","permission_mode","turn_timeout","memory_bytes","pids","disk_bytes","egress","mcp_servers","setup","invoke_concurrency"}`)))
		return
	}
	next := s.events.metaNext
	if err := s.h.applySettings(&next, p); err != nil {
		respond(msg, errorReply(err))
		return
	}
	s.events.metaNext = next
	s.events.metaDirty = true
	s.events.metaAfter = append(s.events.metaAfter, func(err error) {
		if err != nil {
			s.log.Warn("write session metadata", "err", err)
			respond(msg, errorReply(session.Errorf(session.CodeUnavailable, "the change could not be saved: retry")))
			return
		}
		sess := s.sessionFor(who) // on the actor; done runs off it
		s.putCatalogThen(func() { respond(msg, session.Reply{Session: &sess}) })
	})
}

// applySettings applies p, a change of OpSettings, to next: the title and
// what limitSettings checks, then the permission mode (agent sessions only)
// and the turn timeout (at most node.turn_timeout). It changes next only
// through its own fields and writes nothing, so a session being created
// checks its settings with it before anything exists (checkCreateSettings).
func (h *Host) applySettings(next *session.Meta, p *session.SettingsPatch) error {
	if t := p.Title; t != nil {
		if len(*t) > session.MaxTitleBytes {
			return session.Errorf(session.CodeBadRequest, "title is longer than %d bytes", session.MaxTitleBytes)
		}
		if !utf8.ValidString(*t) {
			return session.Errorf(session.CodeBadRequest, "title is not valid UTF-8")
		}
		next.Title = *t
	}
	if err := h.limitSettings(next, p); err != nil {
		return err
	}
	if m := p.PermissionMode; m != nil {
		if next.Harness.Agent == "" {
			return session.Errorf(session.CodeBadRequest, "settings: permission_mode is for agent sessions; this session runs no agent")
		}
		hn := next.Harness
		hn.PermissionMode = *m
		if *m == "" {
			return session.Errorf(session.CodeBadRequest, `settings: permission_mode must be "ask", "auto-edit" or "auto"`)
		}
		if err := hn.Validate(); err != nil {
			return err
		}
		next.Harness = hn
	}
	if d := p.TurnTimeout; d != nil {
		limit := h.cfg.TurnTimeout
		switch {
		case *d <= 0:
			return session.Errorf(session.CodeBadRequest, "settings: turn_timeout must be positive")
		case time.Duration(*d) > limit:
			return session.Errorf(session.CodeForbidden, "settings: turn_timeout %v is beyond this server's limit of %v (node.turn_timeout)", time.Duration(*d), limit)
		}
		next.TurnTimeout = *d
	}
	return nil
}

// checkCreateSettings checks the settings of a create request against the
// new session's metadata as it will be (its harness, its egress allowlist
// as the node allows it), so that a refused setting is refused before the
// session, its history or its catalog entry exist. opener.create applies
// them (applySettings) to the metadata it writes first.
func (h *Host) checkCreateSettings(req *session.PlaceRequest) error {
	if req.Settings == nil {
		return nil
	}
	own, err := h.egress.check(req.Egress)
	if err != nil {
		return err
	}
	return h.applySettings(&session.Meta{Harness: req.Harness, Egress: own}, req.Settings)
}

// turnTimeout bounds the session's next turn: its own turn_timeout if it
// has one within the node's, else the node's.
func (s *sessionActor) turnTimeout() time.Duration {
	if d := time.Duration(s.events.meta.TurnTimeout); d > 0 && d < s.h.cfg.TurnTimeout {
		return d
	}
	return s.h.cfg.TurnTimeout
}

// limitSettings applies p's egress allowlist (as opEgress), harness (a
// configured template, a command, or an installed agent), agent (an
// installed one; the session's agent process is replaced at the next turn
// and re-hydrated), sandbox limits, MCP servers and setup command to next,
// each within what the operator allows: memory and pids at most
// the node's sandbox limits (forbidden beyond them, or when the node sets
// none, naming the setting), the workspace's disk at least
// session.MinDiskBytes and at most sandbox.workspace_disk_bytes (the node's
// quota; forbidden when it has none), MCP servers valid (session.ValidateMCPServers)
// and those over http or sse reaching a host of the session's egress
// allowlist (forbidden otherwise: the sandbox could not reach them).
func (h *Host) limitSettings(next *session.Meta, p *session.SettingsPatch) error {
	limit := func(what, key string, v, max int64) error {
		switch {
		case v < 0:
			return session.Errorf(session.CodeBadRequest, "settings: %s must not be negative", what)
		case v > 0 && max == 0:
			return session.Errorf(session.CodeForbidden, "settings: %s: this server sets no limit a session may choose within (%s); ask the operator", what, key)
		case v > max:
			return session.Errorf(session.CodeForbidden, "settings: %s %d is beyond this server's limit of %d (%s)", what, v, max, key)
		}
		return nil
	}
	if v := p.Egress; v != nil {
		own, err := h.egress.check(*v)
		if err != nil {
			return err
		}
		next.Egress = own
	}
	if v := p.Harness; v != nil {
		hn := *v
		hn.PermissionMode = ""
		if hn.Agent != "" {
			hn.PermissionMode = next.Harness.PermissionMode
		}
		if err := hn.Validate(); err != nil {
			return err
		}
		if err := h.checkAgent(hn.Agent); err != nil {
			return err
		}
		if hn.Template != "" {
			if _, ok := h.templates[hn.Template]; !ok {
				return session.Errorf(session.CodeBadRequest, "settings: harness template %q is not configured on this server", hn.Template)
			}
		}
		if hn.Agent == "" && len(next.MCPServers) > 0 && p.MCPServers == nil {
			return session.Errorf(session.CodeBadRequest, `settings: a harness without an agent takes no mcp_servers; remove them ("mcp_servers":[]) in the same change`)
		}
		if hn.Agent != next.Harness.Agent {
			next.AgentSession = ""
		}
		next.Harness = hn
	}
	if v := p.Agent; v != nil {
		if *v == "" {
			return session.Errorf(session.CodeBadRequest, "settings: agent must name an agent (atrium agents ls)")
		}
		if err := h.checkAgent(*v); err != nil {
			return err
		}
		if *v != next.Harness.Agent {
			// The new agent cannot load the old one's session: it is
			// given the conversation from the history instead.
			next.Harness = session.Harness{Agent: *v, PermissionMode: next.Harness.PermissionMode}
			next.AgentSession = ""
		}
	}
	if v := p.MemoryBytes; v != nil {
		if err := limit("memory_bytes", "sandbox.memory_bytes", *v, h.cfg.SandboxSpec.MemoryBytes); err != nil {
			return err
		}
		next.MemoryBytes = *v
	}
	if v := p.Pids; v != nil {
		if err := limit("pids", "sandbox.pids", int64(*v), int64(h.cfg.SandboxSpec.Pids)); err != nil {
			return err
		}
		next.Pids = *v
	}
	if v := p.DiskBytes; v != nil {
		if *v > 0 && *v < session.MinDiskBytes {
			return session.Errorf(session.CodeBadRequest, "settings: disk_bytes %d is too small: at least %d (16 MiB), or 0 for the server's", *v, session.MinDiskBytes)
		}
		if err := limit("disk_bytes", "sandbox.workspace_disk_bytes", *v, h.cfg.SandboxSpec.DiskBytes); err != nil {
			return err
		}
		next.DiskBytes = *v
	}
	if v := p.MCPServers; v != nil {
		if len(*v) > 0 && next.Harness.Agent == "" {
			return session.Errorf(session.CodeBadRequest, "settings: mcp_servers are for agent sessions; this session runs no agent")
		}
		if err := session.ValidateMCPServers(*v); err != nil {
			return err
		}
		if err := h.reachable(next.Egress, *v); err != nil {
			return err
		}
		next.MCPServers = slices.Clone(*v)
	}
	if v := p.InvokeConcurrency; v != nil {
		// The gateway checked it against its cap, which the node does not
		// know.
		if *v < 0 {
			return session.Errorf(session.CodeBadRequest, "settings: invoke_concurrency must not be negative")
		}
		next.InvokeConcurrency = *v
	}
	if v := p.Setup; v != nil {
		if err := session.ValidateSetup(*v); err != nil {
			return err
		}
		next.Setup = *v
	}
	return nil
}

// reachable checks that the session's sandbox may reach the host of each
// http or sse MCP server: the node gives sandboxes the network, or the
// session's effective egress allowlist allows it.
func (h *Host) reachable(own []string, servers []session.MCPServer) error {
	if h.egress == nil || h.egress.network {
		return nil
	}
	var allow *egress.Allowlist
	for _, m := range servers {
		if m.ServerType() == session.MCPStdio {
			continue
		}
		if allow == nil {
			var err error
			if allow, err = egress.ParseAllowlist(h.egress.effective(own)); err != nil {
				return fmt.Errorf("settings: egress allowlist: %w", err)
			}
		}
		u, _ := url.Parse(m.URL) // validated
		port := 80
		if u.Scheme == "https" {
			port = 443
		}
		if ps := u.Port(); ps != "" {
			port, _ = strconv.Atoi(ps)
		}
		host := u.Hostname()
		if !allow.Allows(host, port) {
			return session.Errorf(session.CodeForbidden,
				"settings: mcp_servers: %s's host %s is not in the session's egress allowlist (sandbox.egress, or the session's own egress allowlist); the sandbox could not reach it",
				m.Name, net.JoinHostPort(host, strconv.Itoa(port)))
		}
	}
	return nil
}

// sandboxLimits are a session's own sandbox limits (settings.memory_bytes,
// settings.pids); zero fields are the node's.
type sandboxLimits struct {
	memory int64
	pids   int
	disk   int64 // settings.disk_bytes
}

// sandboxLimits returns the session's own sandbox limits, which its actor
// sets on the box before each turn; they apply when the sandbox is next
// opened.
func (s *sessionActor) sandboxLimits() sandboxLimits {
	return sandboxLimits{memory: s.events.meta.MemoryBytes, pids: s.events.meta.Pids, disk: s.events.meta.DiskBytes}
}

// apply sets l's limits on spec (the node's where l has none).
func (l sandboxLimits) apply(spec *compute.Spec) {
	if l.memory > 0 {
		spec.MemoryBytes = l.memory
	}
	if l.pids > 0 {
		spec.Pids = l.pids
	}
	if l.disk > 0 {
		spec.DiskBytes = l.disk
	}
}
