// Package session owns Atrium's domain: session and event identities, the
// event kinds and their data, principals and roles, the JSON wire frames of
// the client protocol, the NATS subjects and message types that gateways and
// nodes exchange, the turn queue state machine, the harness line protocol and
// the sentinel errors shared by every layer.
//
// It is the contract between the actor (node) side and the gateway side, which
// never import each other. It uses the standard library only and does no I/O.
package session
