package server

// StopNATS shuts the embedded NATS server down, as an outage would.
func StopNATS(s *Server) { s.stopNATS() }

// StartNATS starts the embedded NATS server again on the same store; the
// server's connection reconnects to it.
func StartNATS(s *Server) error { return s.startNATS() }

// TenantClusterStatusOf is what GET /v1/cluster answers a tenant admin who is
// not an operator.
var TenantClusterStatusOf = (*Server).tenantClusterStatus
