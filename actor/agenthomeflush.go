package actor

import (
	"context"
	"io/fs"
	"path/filepath"
	"time"
)

// Bounds of awaitHomeFlush.
const (
	// homeFlushWait bounds how long the end of a turn waits for an agent
	// that writes its transcript after it answers to write it.
	homeFlushWait = time.Second
	// homeFlushPoll is how often the home is looked at meanwhile.
	homeFlushPoll = 20 * time.Millisecond
)

// awaitHomeFlush waits, up to homeFlushWait after answered (when the
// agent answered the turn's session/prompt), until a file of b's agent
// home was written at or after answered, if b's agent writes its
// transcript after it answers (AgentLaunch.WritesAfterAnswer: Claude Code
// does, some milliseconds later, more under load). The home saved at the
// turn's end then holds the turn's answer, so that another node taking the
// session over after a kill -9 right after the turn loads the whole
// conversation (TestCluster_ClaudeAgentKillOwner); without the wait the
// saved copy sometimes ended at the turn's prompt. A home a VM keeps is not
// waited for: the node does not see its files.
func (h *Host) awaitHomeFlush(ctx context.Context, b *box, answered time.Time) {
	p, hm := b.agent, h.agents.home(b.id)
	if p == nil || !p.flush || hm == nil || hm.at != "" || h.cfg.Store == nil {
		return
	}
	t := time.NewTicker(homeFlushPoll)
	defer t.Stop()
	for {
		if !lastWrite(hm.dir).Before(answered) || time.Since(answered) >= homeFlushWait {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// lastWrite returns the latest modification time of the regular files
// under dir (the zero time when there are none).
func lastWrite(dir string) time.Time {
	var last time.Time
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if fi, err := d.Info(); err == nil && fi.ModTime().After(last) {
			last = fi.ModTime()
		}
		return nil
	})
	return last
}
