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
//
// In a VM (the provider is a mountKeeper: compute/remote) the home is a
// directory the VM's agent keeps, seeded with the node directory's
// settings files at every open; the node saves it the way it saves
// /workspace (the VM uploads through presigned URLs, compute/mount's
// plans) at the same moments, and restores it into a fresh VM before the
// first agent process starts there (restoreSandboxHome), so that after the
// VM is lost the new process loads its session.
//
// When the provider's sleep keeps processes (a sleepKeeper: VM hosts
// pause and save the VM), an idle sleep keeps the agent process too: its
// ACP connection (the streams of its Exec) is suspended with the sandbox
// and reattached when it wakes, and the next prompt goes to the same
// process, with no session/load and no re-hydration (agent_turn.go). The
// workspace and the home are then not restored over it.

// sleepKeeper is a Provider whose sandboxes keep their processes while
// they sleep (compute/remote with VM hosts): a running command's Process
// carries on after the wake, or ends with Exit.Lost when its machine could
// not be woken.
type sleepKeeper interface{ SleepKeepsProcesses() bool }

// mountKeeper is a Provider whose sandboxes keep the directories of the
// node's writable mounts themselves (compute/remote: in the VM, seeded
// with the node directory's files at every open). Its sandboxes are
// mountWorkspacers.
type mountKeeper interface{ KeepsMounts() bool }

// mountWorkspacer is a sandbox whose kept mount at a sandbox path can be
// saved and restored like its workspace.
type mountWorkspacer interface {
	MountWorkspace(sandboxPath string) mount.Workspace
}

// sleepKeepsProcesses reports whether the provider's sleep keeps the
// sandbox's processes.
func (h *Host) sleepKeepsProcesses() bool {
	k, ok := h.cfg.Provider.(sleepKeeper)
	return ok && k.SleepKeepsProcesses()
}

// homeInSandbox reports whether agent homes live in the sandboxes (VMs)
// rather than in the node's directory bound into them.
func (h *Host) homeInSandbox() bool {
	k, ok := h.cfg.Provider.(mountKeeper)
	return ok && k.KeepsMounts()
}

// homeMount returns the sandbox path of launch's home.
func homeMount(launch AgentLaunch) string {
	for _, m := range launch.Mounts {
		if m.Host == launch.Home && !m.ReadOnly {
			return m.Sandbox
		}
	}
	return ""
}

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
	return h.homeHoldsSaved(ctx, id, func(p string) (int64, int64, bool) {
		fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(p)))
		if err != nil || !fi.Mode().IsRegular() {
			return 0, 0, false
		}
		return fi.Size(), fi.ModTime().UnixNano(), true
	})
}

// homeHoldsSaved reports whether a home whose regular files stat describes
// (size, modification time, whether it is one) holds every file of id's
// saved home at least as long and as recent. Without a saved home it
// reports false.
func (h *Host) homeHoldsSaved(ctx context.Context, id session.ID, stat func(path string) (size, mtime int64, ok bool)) (bool, error) {
	m, etag, err := mount.ReadManifest(ctx, h.cfg.Store, agentHomePrefix(id))
	if err != nil || etag == "" {
		return false, err
	}
	for _, e := range m.Entries {
		if e.Type != mount.TypeFile {
			continue
		}
		size, mtime, ok := stat(e.Path)
		if !ok || size < e.Size || mtime < e.MTime {
			return false, nil
		}
	}
	return true, nil
}

// restoreSandboxHome restores b's agent home into its sandbox, which keeps
// it (homeInSandbox), before the session's first agent process starts in
// it: unless this node restored it into the same machine already, the
// saved copy is restored, and the open is repeated to write the settings
// files of launch over it. A home the sandbox holds that is newer than
// the saved copy (the same VM, found again by a restarted node) is kept
// as it is; the saved copy is then restored aside, only to claim it for
// the saves that follow. No agent process may run in the sandbox: the
// sandbox refuses the restore while commands run.
func (h *Host) restoreSandboxHome(ctx context.Context, b *box, launch AgentLaunch, fence int64) error {
	at := homeMount(launch)
	if h.cfg.Store == nil || at == "" {
		return nil
	}
	if hm := h.agents.home(b.id); hm != nil && hm.at == at && hm.machine == b.machine {
		return nil
	}
	mw, ok := b.sb.(mountWorkspacer)
	if !ok {
		return fmt.Errorf("restore the agent's home: the sandbox (%T) cannot move its home", b.sb)
	}
	ws := mw.MountWorkspace(at)
	scan, err := ws.Scan(ctx, &mount.ScanRequest{NoHash: true})
	if err != nil {
		return fmt.Errorf("restore the agent's home: %w", err)
	}
	inVM := make(map[string]mount.Entry, len(scan.Entries))
	for _, e := range scan.Entries {
		inVM[e.Path] = e
	}
	keep, err := h.homeHoldsSaved(ctx, b.id, func(p string) (int64, int64, bool) {
		e, ok := inVM[p]
		return e.Size, e.MTime, ok && e.Type == mount.TypeFile
	})
	if err != nil {
		return fmt.Errorf("restore the agent's home: %w", err)
	}
	var target mount.Workspace = ws
	if keep {
		dir, err := os.MkdirTemp(filepath.Dir(launch.Home), ".agent-home-claim-")
		if err != nil {
			return fmt.Errorf("restore the agent's home: %w", err)
		}
		defer os.RemoveAll(dir)
		target = &mount.Dir{Path: dir, Blob: h.cfg.Store}
	}
	vol := &mount.Volume{Blob: h.cfg.Store, Prefix: agentHomePrefix(b.id), Logger: h.log.With("session", b.id, "volume", "agent-home")}
	st, err := vol.Restore(ctx, target, fence)
	if err != nil {
		return fmt.Errorf("restore the agent's home: %w", err)
	}
	h.agents.setHome(b.id, &agentHome{dir: launch.Home, vol: vol, at: at, machine: b.machine})
	if keep || st.ManifestBytes == 0 {
		return nil
	}
	// The restored tree replaced the settings files the open wrote (the
	// session's permission mode may have changed since the save):
	// opening again writes them anew.
	sb, err := h.openSandbox(ctx, b, b.fence)
	if err != nil {
		return fmt.Errorf("write the agent's settings over its restored home: %w", err)
	}
	b.sb = sb
	if b.ws != nil {
		if b.ws, err = h.cfg.WorkspaceOf(sb); err != nil {
			b.drop()
			return fmt.Errorf("write the agent's settings over its restored home: %w", err)
		}
	}
	return nil
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
	var ws mount.Workspace = &mount.Dir{Path: hm.dir, Blob: h.cfg.Store}
	if hm.at != "" {
		mw, ok := b.sb.(mountWorkspacer)
		if !ok || hm.machine != b.machine || h.replaced(b) {
			// The machine it was restored into is gone: what another
			// holds is not this home. It is restored before the next
			// agent process starts.
			h.agents.setHome(b.id, nil)
			return nil
		}
		ws = mw.MountWorkspace(hm.at)
	}
	if _, err := hm.vol.Save(ctx, ws, fence); err != nil {
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

// keepAgent decides, before b's sandbox goes to sleep, whether its agent
// process sleeps with it: with keep (an idle sleep: not the node stopping,
// nor files being written to the saved workspace, which the wake must
// restore), a provider whose sleep keeps processes and a live agent that
// may serve the next prompt, its home is saved and it is kept; otherwise
// endAgent ends it (saving its home). It reports whether it is kept.
func (h *Host) keepAgent(ctx context.Context, b *box, keep bool, note noteFunc) bool {
	p := b.agent
	if !keep || p == nil || p.stale || p.dead() || !h.sleepKeepsProcesses() {
		h.endAgent(ctx, b, note)
		return false
	}
	if err := h.saveAgentHome(ctx, b, b.fence); err != nil {
		note("", "", homeError("saved", err))
	}
	return true
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
