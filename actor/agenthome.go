package actor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/session"
)

// The agent home saved with the session (DESIGN §6): what an agent keeps
// outside /workspace (HOME, CODEX_HOME, its transcripts) is a host
// directory (AgentLaunch.Home) bound into the sandbox. The node saves it
// to the object store under agentHomePrefix, with compute/mount's
// content-addressed saving, whenever the turn's workspace is saved and
// when the sandbox goes to sleep (after the agent had time to exit), and
// restores it before the first agent process of the session starts on a
// node that does not hold it: after a takeover, or a restart with a fresh
// data directory, the agent loads its session instead of being
// re-hydrated.
//
// A home is restored only while no live sandbox binds it: Restore swaps
// in a new directory, which a running sandbox would not see.

// agentHomePrefix is the key prefix of session id's saved agent home,
// beside its workspace.
func agentHomePrefix(id session.ID) string { return "sessions/" + string(id) + "/agent-home/" }

// home returns id's agent home as this node holds it, nil if it does not.
func (a *agentSet) home(id session.ID) *agentHome {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.homes[id]
}

func (a *agentSet) setHome(id session.ID, hm *agentHome) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if hm == nil {
		delete(a.homes, id)
		return
	}
	if a.homes == nil {
		a.homes = map[session.ID]*agentHome{}
	}
	a.homes[id] = hm
}

// restoreAgentHome restores b's agent home at dir from its saved copy with
// fence, unless this node already holds it, there is no store, or a live
// sandbox binds it (it is then used as it is, and not saved until a later
// restore). swapped reports that dir was replaced, so a sandbox opened on
// it must be opened again.
func (h *Host) restoreAgentHome(ctx context.Context, b *box, dir string, fence int64) (swapped bool, err error) {
	if h.cfg.Store == nil || dir == "" {
		return false, nil
	}
	if hm := h.agents.home(b.id); hm != nil && hm.dir == dir {
		return false, nil
	}
	if b.sb != nil && !b.asleep && !h.expired(b) && slices.ContainsFunc(b.mounted, func(m compute.Mount) bool { return m.Host == dir }) {
		h.log.Warn("agent home not restored: the sandbox binds it", "session", b.id)
		return false, nil
	}
	vol := &mount.Volume{Blob: h.cfg.Store, Prefix: agentHomePrefix(b.id), Logger: h.log.With("session", b.id, "volume", "agent-home")}
	target := dir
	keep, err := h.localHomeNewer(ctx, b.id, dir)
	if err != nil {
		return false, fmt.Errorf("restore the agent's home: %w", err)
	}
	if keep {
		// This node's copy holds everything saved and more (it wrote
		// after the last save, and then restarted): the saved copy is
		// restored aside, only to claim it for the saves that follow.
		if target, err = os.MkdirTemp(filepath.Dir(dir), ".agent-home-claim-"); err != nil {
			return false, fmt.Errorf("restore the agent's home: %w", err)
		}
		defer os.RemoveAll(target)
	}
	st, err := vol.Restore(ctx, &mount.Dir{Path: target, Blob: h.cfg.Store}, fence)
	if err != nil {
		return false, fmt.Errorf("restore the agent's home: %w", err)
	}
	h.agents.setHome(b.id, &agentHome{dir: dir, vol: vol})
	return !keep && st.ManifestBytes > 0, nil
}

// localHomeNewer reports whether the agent home at dir holds every file of
// the saved copy at least as long and as recent (the agent only appends to
// its transcripts), so restoring would lose what was written after the last
// save: after a restart of this node, the local copy is the newer one.
func (h *Host) localHomeNewer(ctx context.Context, id session.ID, dir string) (bool, error) {
	if names, err := os.ReadDir(dir); err != nil || len(names) == 0 {
		return false, nil // None here: restore.
	}
	m, etag, err := mount.ReadManifest(ctx, h.cfg.Store, agentHomePrefix(id))
	if err != nil || etag == "" {
		return false, err
	}
	for _, e := range m.Entries {
		if e.Type != mount.TypeFile {
			continue
		}
		fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(e.Path)))
		if err != nil || !fi.Mode().IsRegular() || fi.Size() < e.Size || fi.ModTime().UnixNano() < e.MTime {
			return false, nil
		}
	}
	return true, nil
}

// saveAgentHome saves b's agent home if this node holds it. A save that
// lost to another writer (another node took the session over) forgets the
// home, so that it is restored before it is used again.
func (h *Host) saveAgentHome(ctx context.Context, b *box, fence int64) error {
	hm := h.agents.home(b.id)
	if hm == nil || h.cfg.Store == nil {
		return nil
	}
	if err := h.nodeMayWrite(); err != nil {
		return fmt.Errorf("save the agent's home: %w", err)
	}
	if _, err := hm.vol.Save(ctx, &mount.Dir{Path: hm.dir, Blob: h.cfg.Store}, fence); err != nil {
		if errors.Is(err, mount.ErrConflict) || errors.Is(err, mount.ErrFenced) || errors.Is(err, mount.ErrNotRestored) {
			h.agents.setHome(b.id, nil)
		}
		return fmt.Errorf("save the agent's home: %w", err)
	}
	return nil
}

// deleteAgentHome deletes session id's saved agent home, for a deleted
// session.
func (h *Host) deleteAgentHome(ctx context.Context, id session.ID) error {
	h.agents.setHome(id, nil)
	if h.cfg.Store == nil {
		return nil
	}
	vol := &mount.Volume{Blob: h.cfg.Store, Prefix: agentHomePrefix(id), Logger: h.log.With("session", id, "volume", "agent-home")}
	return vol.Delete(ctx)
}

// endAgent ends b's agent process before its sandbox goes to sleep (idle,
// or the node stops): its input is closed, so that it may write what it
// keeps and exit; after agentExitGrace it gets SIGTERM, and after
// agentTermGrace more it is killed. Its home is then saved; a failure is
// reported through note.
func (h *Host) endAgent(ctx context.Context, b *box, note noteFunc) {
	p := b.agent
	if p == nil {
		return
	}
	b.agent = nil
	_ = p.proc.Stdin().Close()
	exited := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-p.exited:
			return true
		case <-t.C:
		case <-ctx.Done():
		}
		return false
	}
	if !exited(agentExitGrace) {
		// Claude Code keeps running when its input ends; SIGTERM ends it.
		_ = p.proc.Signal(syscall.SIGTERM)
		if !exited(agentTermGrace) {
			h.log.Info("agent did not exit after its input closed and SIGTERM; killing it", "session", b.id)
		}
	}
	p.kill()
	if err := h.saveAgentHome(ctx, b, b.fence); err != nil {
		note("", "", homeError("saved", err))
	}
}

// homeError is the error event of a failed save or restore of an agent
// home.
func homeError(what string, err error) *session.ErrorData {
	return &session.ErrorData{Code: errorCode(err), Message: "the agent's home (its own record of the conversation) was not " + what + ": " +
		storeProblem(err) + "; a new agent process is given the conversation from the history instead"}
}
