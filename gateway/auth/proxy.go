package auth

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// TrustedProxies are the addresses of the reverse proxies (ingress
// controllers, load balancers) allowed to say who their client is with
// X-Forwarded-For. A request from anywhere else is its own client, whatever
// headers it sends.
type TrustedProxies []netip.Prefix

// ParseTrustedProxies parses addresses and CIDR prefixes ("10.0.0.0/8",
// "127.0.0.1", "fd00::/8").
func ParseTrustedProxies(list []string) (TrustedProxies, error) {
	var ps TrustedProxies
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if strings.Contains(s, "/") {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return nil, fmt.Errorf("trusted proxy %q: want an IP address or a CIDR prefix such as 10.0.0.0/8", s)
			}
			ps = append(ps, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("trusted proxy %q: want an IP address or a CIDR prefix such as 10.0.0.0/8", s)
		}
		a = a.Unmap()
		ps = append(ps, netip.PrefixFrom(a, a.BitLen()))
	}
	return ps, nil
}

func (ps TrustedProxies) trusted(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Client returns the address of the client that made r: its peer, or, when
// the peer is a trusted proxy, the nearest address in X-Forwarded-For that is
// not itself a trusted proxy (read from the right, so that a client cannot
// choose it by sending its own X-Forwarded-For). An unparsable entry ends the
// walk at the last trusted hop.
func (ps TrustedProxies) Client(r *http.Request) netip.Addr {
	peer := peerAddr(r)
	if !peer.IsValid() || len(ps) == 0 || !ps.trusted(peer) {
		return peer
	}
	client := peer
	hops := r.Header.Values("X-Forwarded-For")
	for i := len(hops) - 1; i >= 0; i-- {
		parts := strings.Split(hops[i], ",")
		for j := len(parts) - 1; j >= 0; j-- {
			a, err := netip.ParseAddr(strings.TrimSpace(parts[j]))
			if err != nil {
				return client
			}
			client = a.Unmap()
			if !ps.trusted(client) {
				return client
			}
		}
	}
	return client
}

// Handler returns next with each request's RemoteAddr set to its real client
// (Client) when it came through a trusted proxy, so that everything after it
// — the dev identity's loopback check, the failed-login throttle, the audit
// log's remote, the access log — sees the client rather than the proxy. With
// no trusted proxies it returns next.
func (ps TrustedProxies) Handler(next http.Handler) http.Handler {
	if len(ps) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c := ps.Client(r); c.IsValid() && c != peerAddr(r) {
			r2 := *r
			r2.RemoteAddr = net.JoinHostPort(c.String(), "0")
			r = &r2
		}
		next.ServeHTTP(w, r)
	})
}

// peerAddr is the address r's connection came from.
func peerAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err == nil {
		return ap.Addr().Unmap()
	}
	a, err := netip.ParseAddr(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return a.Unmap()
}
