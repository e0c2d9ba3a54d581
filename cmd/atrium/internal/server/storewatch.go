package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/atriumhq/atrium/storage/blob"
)

// Starting while the object store is down (issue 21 item 6): an S3 store
// that cannot be reached at start-up does not stop the process. It starts
// without it, says once and plainly what waits for the store, keeps
// checking, and says when it is back. Nothing has to be reopened: every
// store operation meanwhile fails with blob.ErrUnavailable (turns that need
// their workspace fail with an error event naming the object store) and
// succeeds once the service answers again. A store that answers with a
// configuration error (no such bucket, refused credentials) still stops
// start-up: retrying would not fix it.

// Store checks at start-up.
const (
	// StoreCheckTimeout bounds the start-up check of an S3 store.
	StoreCheckTimeout = 15 * time.Second
	// StoreRecheckInterval is how often an unavailable store is checked
	// again.
	StoreRecheckInterval = 5 * time.Second
)

// storeWatch checks an unavailable store until it answers.
type storeWatch struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// openStoreWaiting opens the object store of cfg; an S3 store that cannot
// be reached is returned anyway, with a watch that logs when it is back.
func openStoreWaiting(ctx context.Context, cfg Storage, log *slog.Logger) (blob.Store, *storeWatch, error) {
	if cfg.Type != StorageS3 {
		st, err := openStore(ctx, cfg)
		return st, nil, err
	}
	st, err := blob.NewS3(cfg.S3)
	if err != nil {
		return nil, nil, fmt.Errorf("object store: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, StoreCheckTimeout)
	err = st.Check(cctx)
	cancel()
	switch {
	case err == nil:
		return st, nil, nil
	case !errors.Is(err, blob.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded):
		st.Close()
		return nil, nil, fmt.Errorf("object store: %w", err)
	}
	log.Warn("OBJECT STORE UNAVAILABLE: starting without it. Sessions, history, prompts and watchers work; "+
		"sandboxes cannot restore or save their workspaces (their turns fail with an error naming the object store), "+
		"workspace files of sleeping sandboxes, forks and history checkpoints wait for it; checking again every "+
		StoreRecheckInterval.String()+" and saying when it is back",
		"endpoint", st.Endpoint(), "bucket", cfg.S3.Bucket, "err", err)
	w := &storeWatch{}
	wctx, wcancel := context.WithCancel(context.Background())
	w.cancel = wcancel
	w.wg.Go(func() { w.run(wctx, st, cfg.S3.Bucket, log) })
	return st, w, nil
}

func (w *storeWatch) run(ctx context.Context, st *blob.S3, bucket string, log *slog.Logger) {
	t := time.NewTicker(StoreRecheckInterval)
	defer t.Stop()
	down := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, StoreCheckTimeout)
		err := st.Check(cctx)
		cancel()
		switch {
		case err == nil:
			log.Info("object store available again: workspaces are saved and restored, checkpoints written",
				"endpoint", st.Endpoint(), "bucket", bucket, "unavailable_for", time.Since(down).Round(time.Second))
			return
		case ctx.Err() != nil:
			return
		case !errors.Is(err, blob.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded):
			log.Error("object store answers but refuses this configuration; fix it and restart",
				"endpoint", st.Endpoint(), "bucket", bucket, "err", err)
			return
		}
	}
}

// stop ends the watch. Safe on nil and twice.
func (w *storeWatch) stop() {
	if w == nil {
		return
	}
	w.cancel()
	w.wg.Wait()
}
