package server

import (
	"fmt"
	"log/slog"

	natsserver "github.com/nats-io/nats-server/v2/server"
)

// natsLogger passes the embedded NATS server's log lines to Atrium's log
// (component nats-server), so that what the server says about itself —
// above all "JetStream out of resources, will be DISABLED" on a full disk —
// is seen where the operator looks. Notices are info, debug and trace lines
// debug.
type natsLogger struct{ log *slog.Logger }

var _ natsserver.Logger = natsLogger{}

// Noticef logs at debug: the server's notices are its start-up banner and
// routine news (two dozen lines at every start of `atrium dev`); its
// warnings and errors, such as JetStream running out of disk, are what an
// operator must see.
func (l natsLogger) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l natsLogger) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l natsLogger) Fatalf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l natsLogger) Errorf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l natsLogger) Debugf(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l natsLogger) Tracef(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
