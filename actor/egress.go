package actor

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/atriumhq/atrium/compute/egress"
	"github.com/atriumhq/atrium/session"
)

// egressPolicy decides which egress allowlist entries a session may ask for
// (Config.EgressPermit) and makes a session's effective allowlist: the
// node's default (Config.SandboxSpec.Egress) and the session's own entries.
type egressPolicy struct {
	defaults []string      // normalized
	permit   []egressEntry // what owners may ask for
	network  bool          // sandboxes have the network: allowlists are moot
}

// egressEntry is one normalized allowlist entry, taken apart.
type egressEntry struct {
	text     string
	host     string     // lowercase name; for a wildcard, the domain below which it matches
	wildcard bool       // "*.example.com"
	addr     netip.Addr // valid for an IP address
	port     int        // 0: ports 80 and 443
}

// newEgressPolicy validates the node's default allowlist and permit list.
func newEgressPolicy(defaults, permit []string, network bool) (*egressPolicy, error) {
	p := &egressPolicy{network: network}
	for _, e := range defaults {
		n, err := parseEgressEntry(e)
		if err != nil {
			return nil, fmt.Errorf("sandbox egress: %w", err)
		}
		p.defaults = append(p.defaults, n.text)
	}
	for _, e := range permit {
		n, err := parseEgressEntry(e)
		if err != nil {
			return nil, fmt.Errorf("egress permit: %w", err)
		}
		p.permit = append(p.permit, n)
	}
	return p, nil
}

// parseEgressEntry validates e with compute/egress's rules and takes its
// normalized form apart.
func parseEgressEntry(e string) (egressEntry, error) {
	a, err := egress.ParseAllowlist([]string{e})
	if err != nil {
		return egressEntry{}, err
	}
	n := egressEntry{text: a.String()}
	host := n.text
	if strings.HasPrefix(host, "[") || strings.Count(host, ":") == 1 {
		h, port, err := net.SplitHostPort(host)
		if err != nil {
			return egressEntry{}, fmt.Errorf("egress allowlist entry %q: %w", e, err)
		}
		n.port, _ = strconv.Atoi(port)
		host = h
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		n.addr = addr
		return n, nil
	}
	n.host, n.wildcard = strings.CutPrefix(host, "*.")
	return n, nil
}

// covers reports whether every destination e allows is allowed by p.
func (p egressEntry) covers(e egressEntry) bool {
	switch {
	case p.port == 0 && e.port != 0 && e.port != 80 && e.port != 443:
		return false
	case p.port != 0 && e.port != p.port:
		return false
	case p.addr.IsValid() || e.addr.IsValid():
		return p.addr == e.addr
	case !p.wildcard:
		return !e.wildcard && e.host == p.host
	default: // Any name below p.host.
		return e.host == p.host && e.wildcard || strings.HasSuffix(e.host, "."+p.host)
	}
}

// check validates a session's own allowlist and returns it normalized and
// without duplicates. An entry the permit list does not cover, or any entry
// when sandboxes have the network, is a bad_request.
func (p *egressPolicy) check(entries []string) ([]string, error) {
	if len(entries) > session.MaxEgressEntries {
		return nil, session.Errorf(session.CodeBadRequest, "an egress allowlist has at most %d entries", session.MaxEgressEntries)
	}
	var out []string
	for _, e := range entries {
		n, err := parseEgressEntry(e)
		if err != nil {
			return nil, session.Errorf(session.CodeBadRequest, "%s", err.Error())
		}
		if p.network {
			return nil, session.Errorf(session.CodeBadRequest,
				"sandboxes on this server have the network (no allowlist applies): egress entries are not accepted")
		}
		if !slices.ContainsFunc(p.permit, func(q egressEntry) bool { return q.covers(n) }) {
			return nil, session.Errorf(session.CodeForbidden, "egress to %s is not permitted on this server (sandbox.egress_permit)", n.text)
		}
		if !slices.Contains(out, n.text) {
			out = append(out, n.text)
		}
	}
	return out, nil
}

// effective returns the allowlist of a session's sandbox: the node's
// default and the session's own entries, without duplicates. Entries the
// permit list stopped covering since they were stored are left out.
func (p *egressPolicy) effective(own []string) []string {
	out := slices.Clone(p.defaults)
	if p.network {
		return out
	}
	for _, e := range own {
		n, err := parseEgressEntry(e)
		if err != nil || !slices.ContainsFunc(p.permit, func(q egressEntry) bool { return q.covers(n) }) {
			continue
		}
		if !slices.Contains(out, n.text) {
			out = append(out, n.text)
		}
	}
	return out
}
