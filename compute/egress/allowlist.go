package egress

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Default ports: an allowlist entry without a port allows both.
const (
	portHTTP  = 80
	portHTTPS = 443
)

// Allowlist is the set of destinations a sandbox may reach. The zero value
// and nil allow nothing. An Allowlist is immutable and safe for concurrent
// use.
type Allowlist struct {
	rules []rule
	text  string // the entries, normalized, for messages
}

// rule is one entry of an Allowlist.
type rule struct {
	host     string     // lowercase name without trailing dot; for a wildcard, the suffix without "*."
	wildcard bool       // "*.example.com": any name below host, not host itself
	addr     netip.Addr // valid when the entry is an IP address
	port     int        // 0: ports 80 and 443
}

// ParseAllowlist validates entries and returns the allowlist they make.
// Each entry is a host name ("api.example.com"), a wildcard that matches
// every name below a domain ("*.example.com", which does not match
// example.com itself), or an IP address ("192.0.2.1", "2001:db8::1");
// any of them may end with ":port" ("[2001:db8::1]:8443" for IPv6). An
// entry without a port allows ports 80 (plain HTTP) and 443 (HTTPS through
// CONNECT). Names are compared without case and without a trailing dot.
func ParseAllowlist(entries []string) (*Allowlist, error) {
	a := &Allowlist{}
	texts := make([]string, 0, len(entries))
	for _, e := range entries {
		r, err := parseRule(e)
		if err != nil {
			return nil, err
		}
		a.rules = append(a.rules, r)
		texts = append(texts, r.String())
	}
	a.text = strings.Join(texts, ", ")
	return a, nil
}

// parseRule parses one allowlist entry.
func parseRule(entry string) (rule, error) {
	s := strings.ToLower(strings.TrimSpace(entry))
	bad := func(why string) (rule, error) {
		return rule{}, fmt.Errorf("egress allowlist entry %q: %s", entry, why)
	}
	switch {
	case s == "":
		return bad("empty")
	case s == "*" || s == "*.":
		return bad(`"*" would allow everything: give the sandbox the network instead`)
	case strings.Contains(s, "://"):
		return bad("give a host name such as example.com, not a URL")
	case strings.ContainsAny(s, "/?#@ "):
		return bad("give a host name such as example.com, optionally with :port")
	}
	var r rule
	host := s
	if strings.HasPrefix(s, "[") || strings.Count(s, ":") == 1 {
		h, p, err := net.SplitHostPort(s)
		if err != nil {
			return bad("expected host or host:port")
		}
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return bad("the port must be a number from 1 to 65535")
		}
		host, r.port = h, n
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if addr.Zone() != "" {
			return bad("IPv6 zones are not supported")
		}
		r.addr = addr.Unmap()
		return r, nil
	}
	host = strings.TrimSuffix(host, ".")
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		r.wildcard = true
		host = rest
	}
	if !validName(host) {
		return bad("not a valid host name")
	}
	r.host = host
	return r, nil
}

// validName reports whether s is a DNS name (letters, digits, hyphens and
// underscores in dot-separated labels).
func validName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// String renders the rule as an allowlist entry.
func (r rule) String() string {
	var h string
	switch {
	case r.addr.IsValid():
		h = r.addr.String()
		if r.port != 0 {
			return net.JoinHostPort(h, strconv.Itoa(r.port))
		}
		return h
	case r.wildcard:
		h = "*." + r.host
	default:
		h = r.host
	}
	if r.port != 0 {
		return h + ":" + strconv.Itoa(r.port)
	}
	return h
}

// Allows reports whether the allowlist lets a sandbox reach host on port.
// host is a name or an IP address (IPv6 without brackets); an IP address
// is allowed only when the allowlist lists that address.
func (a *Allowlist) Allows(host string, port int) bool {
	if a == nil {
		return false
	}
	addr, isIP := parseIP(host)
	name := normalizeName(host)
	for _, r := range a.rules {
		if r.port == 0 && port != portHTTP && port != portHTTPS || r.port != 0 && r.port != port {
			continue
		}
		switch {
		case r.addr.IsValid():
			if isIP && r.addr == addr {
				return true
			}
		case isIP:
		case r.wildcard:
			if strings.HasSuffix(name, "."+r.host) {
				return true
			}
		case name == r.host:
			return true
		}
	}
	return false
}

// Empty reports whether the allowlist allows nothing.
func (a *Allowlist) Empty() bool { return a == nil || len(a.rules) == 0 }

// String lists the entries, normalized, separated by ", "; "nothing" when
// there are none.
func (a *Allowlist) String() string {
	if a.Empty() {
		return "nothing"
	}
	return a.text
}

// parseIP parses host as an IP address, unmapping IPv4-in-IPv6.
func parseIP(host string) (netip.Addr, bool) {
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return addr.Unmap(), true
}

// normalizeName lowercases a host name and drops a trailing dot.
func normalizeName(host string) string {
	return strings.TrimSuffix(strings.ToLower(host), ".")
}
