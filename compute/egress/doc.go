// Package egress lets a sandbox that has no network reach the hosts its
// allowlist names, and nothing else, through an HTTP proxy the node runs.
//
// The pieces, as compute/local uses them:
//
//   - An Allowlist: host names ("api.example.com"), wildcards for every
//     name below a domain ("*.example.com"), IP addresses, each optionally
//     with ":port" (without one, ports 80 and 443).
//   - A Proxy per sandbox, served by the node on a Unix socket of its own, so
//     the proxy knows which sandbox a connection comes from without trusting
//     anything the sandbox says. It forwards absolute-form http:// requests
//     and tunnels CONNECT requests (https, or any TCP protocol) to allowed
//     destinations, resolving names itself: the sandbox needs no DNS. It
//     refuses anything else with 403 Forbidden and a body naming the
//     destination and the allowlist ("egress to evil.com is not allowed for
//     this sandbox; allowed: api.example.com"), refuses IP addresses that
//     are not listed, and by default refuses names that resolve to loopback,
//     link-local (cloud metadata), unspecified or multicast addresses, so a
//     listed name cannot be pointed at the node's own services. Denials are
//     logged with the destination's host and port only.
//   - The forwarder (RunForwarder), which runs inside the sandbox: the
//     sandbox's network namespace holds only loopback, so programs that
//     honour HTTP_PROXY and HTTPS_PROXY reach the proxy at 127.0.0.1:<port>,
//     where the forwarder relays each connection to the Unix socket bound
//     into the sandbox. It is the atrium executable itself, run under the
//     name ForwarderName (see IsForwarder), so nothing else has to be
//     installed.
//
// Config.Dial is the test seam: tests map names such as "allowed.test" to
// servers they start on loopback, so nothing leaves the machine.
package egress
