package actor

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/session"
)

const (
	// readQueue bounds history reads waiting for a reader; past it a read
	// is refused with too_many_requests.
	readQueue = 1024
	// readTimeout bounds one history read.
	readTimeout = 10 * time.Second
	// defaultHistoryLimit and maxHistoryLimit bound the events of one
	// history reply.
	defaultHistoryLimit = 1000
	maxHistoryLimit     = 10000
)

// readJob is one history request, served by the host's read pool off the
// session actor's goroutine. done runs when it has been answered.
type readJob struct {
	hist    History
	msg     *nats.Msg
	after   session.Seq
	lastSeq session.Seq // the durable seq when the request was handled
	limit   int
	max     int
	epoch   string
	done    func()
}

func (h *Host) readLoop() {
	for j := range h.reads {
		h.serveRead(j)
	}
}

func (h *Host) serveRead(j readJob) {
	defer j.done()
	ctx, cancel := context.WithTimeout(h.ctx, readTimeout)
	defer cancel()
	// Seqs are contiguous, so the events after j.after that were durable
	// when the request arrived number exactly lastSeq-after; reading no
	// more keeps LastSeq an upper bound of the returned events.
	limit := min(j.limit, int(j.lastSeq-j.after))
	rep := session.Reply{LastSeq: j.lastSeq, Epoch: j.epoch}
	if limit > 0 {
		evs, more, err := j.hist.Range(ctx, j.after, limit, j.max)
		if err != nil {
			h.log.Warn("read history", "err", err)
			respond(j.msg, errorReply(err))
			return
		}
		rep.Events, rep.More = evs, more
	}
	respond(j.msg, rep)
}
