// Package cluster holds the multi-process cluster harness and its tests: the
// proof of scale-out (issue 5). A test starts three nats-servers clustered
// on loopback with JetStream, one S3 server (versitygw), and atrium
// child processes in the gateway and node roles, each node reaching NATS
// through a TCP proxy the test controls. The tests then kill, partition and
// restart those processes while clients watch and prompt sessions through
// the gateways, and check the histories: every acknowledged event present,
// seq without gaps, duplicates or forks.
//
// The benchmarks of this package measure the scale-out figures recorded in
// docs/benchmarks.md: takeover time, cross-gateway fan-out, activation
// throughput and memory per hibernated session.
//
// The package has no code outside its tests.
package cluster
