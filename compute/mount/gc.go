package mount

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob"
)

// Defaults of Collector.
const (
	// DefaultKeepHistory is how long kept manifests (the workspace as of
	// each turn and file write, for turn changes and forks at an older
	// seq) are kept.
	DefaultKeepHistory = 24 * time.Hour
	// DefaultMaxSave is how long a save in progress (its pending marker)
	// protects its volume's objects; an older marker was left by a save
	// that crashed.
	DefaultMaxSave = 6 * time.Hour
)

// pendingDir holds the markers of saves in progress: Save writes
// pending/<id> before it uploads anything and deletes it after the manifest
// is written, so a collector never takes an object whose manifest is not
// written yet, however long the upload takes.
const pendingDir = "pending/"

// Collector deletes what no saved workspace of a store references any more:
// content objects (packs and large files) that neither a current manifest
// nor a kept manifest still within KeepHistory names, kept manifests past
// KeepHistory that no fork is based on, and fork markers of forks that are
// gone. One pass (Collect) lists everything under "sessions/" once, so it
// also measures what each session stores (CollectStats.Usage).
//
// It is safe against concurrent saves, forks and file writes on any node:
// nothing younger than Grace at the start of the pass is deleted, a volume
// with a save in progress (a pending marker younger than MaxSave) loses
// nothing, and manifests are read after the listing, so a save that
// finished during the listing is seen. Several collectors may run at once
// (on several nodes); deleting is idempotent.
type Collector struct {
	// Blob is the object store. Required.
	Blob blob.Store
	// Grace spares objects younger than it; 0 means DefaultCollectGrace.
	Grace time.Duration
	// KeepHistory is how long kept manifests stay (and with them the
	// content they name); 0 means DefaultKeepHistory. A fork at a seq
	// whose kept manifest is gone fails, naming this.
	KeepHistory time.Duration
	// MaxSave bounds how long a pending save protects its volume; 0 means
	// DefaultMaxSave.
	MaxSave time.Duration
	// Volumes names the volumes under sessions/<id>/ a pass collects;
	// nil means just "workspace" (Prefix). Other keys under sessions/ are
	// only measured.
	Volumes []string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger gets one line per pass that deleted something; nil means
	// slog.Default().
	Logger *slog.Logger
}

// CollectStats describes one pass.
type CollectStats struct {
	// Volumes is how many saved workspaces were examined.
	Volumes int `json:"volumes"`
	// Deleted objects (DeletedBytes) were garbage content; Expired are
	// kept manifests past KeepHistory, deleted too.
	Deleted      int   `json:"deleted"`
	DeletedBytes int64 `json:"deleted_bytes"`
	Expired      int   `json:"expired"`
	// Spared counts unreferenced objects left for a later pass: younger
	// than Grace, or of a volume with a save in progress.
	Spared int `json:"spared"`
	// Usage is the bytes each session stores after the pass (everything
	// under sessions/<id>/: workspace content, manifests, checkpoints).
	// Content shared with forks counts for the session that wrote it.
	Usage    map[session.ID]int64 `json:"-"`
	Duration time.Duration        `json:"duration"`
}

// volumeKeys is what one listing found of one session.
type volumeKeys struct {
	manifest bool
	kept     []blob.Info // manifests/<id>.json
	content  []blob.Info // objects/, packs/
	forks    []blob.Info // forks/<child>
	pending  []blob.Info // pending/<save>
}

func (c *Collector) grace() time.Duration   { return cmpOr(c.Grace, DefaultCollectGrace) }
func (c *Collector) keep() time.Duration    { return cmpOr(c.KeepHistory, DefaultKeepHistory) }
func (c *Collector) maxSave() time.Duration { return cmpOr(c.MaxSave, DefaultMaxSave) }

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func (c *Collector) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Collector) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.Default()
}

// Collect runs one pass. It stops at the first error of the store (nothing
// it had not yet decided is deleted); a later pass continues.
func (c *Collector) Collect(ctx context.Context) (CollectStats, error) {
	if c.Blob == nil {
		return CollectStats{}, errors.New("collect workspace garbage: no object store")
	}
	start := c.now()
	cutoff := start.Add(-c.grace())
	st := CollectStats{Usage: make(map[session.ID]int64)}

	names := c.Volumes
	if names == nil {
		names = []string{"workspace"}
	}
	// 1. List everything once.
	vols := make(map[string]*volumeKeys) // by volume prefix
	var order []string
	bytes := make(map[session.ID]int64) // everything under sessions/<id>/
	for info, err := range c.Blob.List(ctx, "sessions/") {
		if err != nil {
			return st, fmt.Errorf("collect workspace garbage: list: %w", err)
		}
		parts := strings.SplitN(info.Key, "/", 4)
		if len(parts) < 3 {
			continue
		}
		bytes[session.ID(parts[1])] += info.Size
		if len(parts) < 4 || !slices.Contains(names, parts[2]) {
			continue
		}
		prefix := "sessions/" + parts[1] + "/" + parts[2] + "/"
		vk := vols[prefix]
		if vk == nil {
			vk = &volumeKeys{}
			vols[prefix] = vk
			order = append(order, prefix)
		}
		rest := parts[3]
		switch {
		case rest == ManifestKey:
			vk.manifest = true
		case strings.HasPrefix(rest, keptDir):
			vk.kept = append(vk.kept, info)
		case strings.HasPrefix(rest, "objects/"), strings.HasPrefix(rest, "packs/"):
			vk.content = append(vk.content, info)
		case strings.HasPrefix(rest, forksDir):
			vk.forks = append(vk.forks, info)
		case strings.HasPrefix(rest, pendingDir):
			vk.pending = append(vk.pending, info)
		}
	}

	// 2. Read the current manifests (after the listing: a save that
	// finished meanwhile is seen) and mark what they use.
	live := make(map[string]bool)   // content keys
	based := make(map[string]bool)  // kept manifest keys a current manifest is based on
	spared := make(map[string]bool) // session prefixes that lose nothing this pass
	for _, prefix := range order {
		vk := vols[prefix]
		for _, p := range vk.pending {
			if p.Modified.After(start.Add(-c.maxSave())) {
				spared[prefix] = true // A save in progress.
			}
		}
		for _, f := range vk.forks {
			if f.Modified.After(cutoff) {
				spared[prefix] = true // A fork in progress may name any kept manifest.
			}
		}
		if !vk.manifest {
			continue
		}
		st.Volumes++
		m, base, err := c.readCurrent(ctx, prefix)
		if errors.Is(err, blob.ErrNotFound) {
			continue // Deleted since the listing.
		}
		if err != nil {
			// A manifest that cannot be read may reference anything its
			// volume holds, and through a base, anything of another.
			return st, fmt.Errorf("collect workspace garbage: %s: %w", prefix, err)
		}
		if base != "" {
			based[base] = true
		}
		markLive(live, prefix, m)
	}

	// 3. Kept manifests: those within KeepHistory or based on are kept and
	// mark what they use; the others expire.
	var expired []blob.Info
	keepFrom := start.Add(-c.keep())
	for _, prefix := range order {
		vk := vols[prefix]
		for _, k := range vk.kept {
			if k.Modified.After(keepFrom) || based[k.Key] || spared[prefix] {
				var m Manifest
				if err := readJSON(ctx, c.Blob, k.Key, &m); err != nil {
					if errors.Is(err, blob.ErrNotFound) {
						continue
					}
					return st, fmt.Errorf("collect workspace garbage: read %s: %w", k.Key, err)
				}
				markLive(live, prefix, &m)
				continue
			}
			expired = append(expired, k)
		}
	}

	// 4. Delete: expired kept manifests first, then content nothing
	// references, then markers of forks that are gone.
	del := func(info blob.Info) error {
		if err := c.Blob.Delete(ctx, info.Key); err != nil {
			return fmt.Errorf("collect workspace garbage: delete %s: %w", info.Key, err)
		}
		bytes[sessionOf(info.Key)] -= info.Size
		return nil
	}
	for _, k := range expired {
		if err := del(k); err != nil {
			return st, err
		}
		st.Expired++
	}
	for _, prefix := range order {
		vk := vols[prefix]
		for _, o := range vk.content {
			switch {
			case live[o.Key]:
			case spared[prefix] || !o.Modified.Before(cutoff):
				st.Spared++
			default:
				if err := del(o); err != nil {
					return st, err
				}
				st.Deleted++
				st.DeletedBytes += o.Size
			}
		}
		for _, f := range vk.forks {
			child := session.ID(strings.TrimPrefix(f.Key, prefix+forksDir))
			if f.Modified.Before(cutoff) && bytes[child] <= 0 {
				if err := del(f); err != nil {
					return st, err
				}
			}
		}
		for _, p := range vk.pending {
			if p.Modified.Before(start.Add(-c.maxSave())) {
				if err := del(p); err != nil { // Left by a save that crashed.
					return st, err
				}
			}
		}
	}
	for id, b := range bytes {
		if b > 0 {
			st.Usage[id] = b
		}
	}
	st.Duration = c.now().Sub(start)
	if st.Deleted > 0 || st.Expired > 0 {
		c.logger().Info("workspace garbage collected", "volumes", st.Volumes, "deleted", st.Deleted,
			"deleted_bytes", st.DeletedBytes, "expired_manifests", st.Expired, "spared", st.Spared, "duration", st.Duration)
	}
	return st, nil
}

// readCurrent reads the current manifest of the volume at prefix, resolved,
// and the key of the kept manifest it is based on, if any.
func (c *Collector) readCurrent(ctx context.Context, prefix string) (*Manifest, string, error) {
	var raw Manifest
	if err := readJSON(ctx, c.Blob, prefix+ManifestKey, &raw); err != nil {
		return nil, "", err
	}
	base := raw.Base
	if base != "" {
		if err := resolveBase(ctx, c.Blob, &raw); err != nil {
			return nil, "", err
		}
	}
	return &raw, base, nil
}

// markLive adds the content keys m (of the volume at prefix) uses.
func markLive(live map[string]bool, prefix string, m *Manifest) {
	for _, e := range m.Entries {
		if e.Type == TypeFile && e.Blob != "" {
			live[BlobKey(prefix, e.Blob)] = true
		}
	}
}

// sessionOf returns the session of a key under sessions/<id>/.
func sessionOf(key string) session.ID {
	parts := strings.SplitN(key, "/", 3)
	if len(parts) < 2 {
		return ""
	}
	return session.ID(parts[1])
}
