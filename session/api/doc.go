// Package api declares the JSON bodies of Atrium's REST API (DESIGN §7 and
// docs/*.md) once, for the gateway that serves them and for gateway/client
// that calls them, so that the two cannot drift apart: a field changed here
// changes both, and a mismatch fails to compile.
//
// Shapes that are also NATS messages or WebSocket frames (Session, Event,
// the hello/event/presence/ack/error/delta frames, FileListing, TurnChanges,
// SecretInfo, AgentList, ErrorBody, EventsPage) live in package session,
// which the node uses too. This package adds the bodies only the REST API
// carries: identity and tokens, the audit log, session requests, schedules,
// dead letters and repository tasks.
//
// Like session, it uses the standard library only and does no I/O. Field
// order and tags are the contract: gateway/wiretest pins their bytes.
package api
