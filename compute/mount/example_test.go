package mount_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/storage/blob"
)

// A session's workspace saved on one machine and restored on another. A
// sandbox in a VM would use a Dir without Blob inside the VM, reached
// through the sandbox agent, and an S3 store on the node.
func ExampleVolume() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "mount-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store := &blob.Dir{Path: filepath.Join(dir, "store")}
	quiet := slog.New(slog.DiscardHandler)

	ws := &mount.Dir{Path: filepath.Join(dir, "node1", "workspace"), Blob: store}
	v := &mount.Volume{Blob: store, Prefix: mount.Prefix("s1"), Logger: quiet}
	// When the sandbox is provisioned: nothing is saved yet.
	if _, err := v.Restore(ctx, ws, 1); err != nil {
		log.Fatal(err)
	}
	os.MkdirAll(ws.Path, 0o755)
	os.WriteFile(filepath.Join(ws.Path, "notes.txt"), []byte("work in progress\n"), 0o644)
	// At the end of a turn, before sleep, periodically.
	st, err := v.Save(ctx, ws, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("saved", st.Files, "file in", st.ObjectsWritten, "object")

	// Another node takes the session over (a greater fencing token).
	ws2 := &mount.Dir{Path: filepath.Join(dir, "node2", "workspace"), Blob: store}
	v2 := &mount.Volume{Blob: store, Prefix: mount.Prefix("s1"), Logger: quiet}
	if _, err := v2.Restore(ctx, ws2, 2); err != nil {
		log.Fatal(err)
	}
	notes, _ := os.ReadFile(filepath.Join(ws2.Path, "notes.txt"))
	fmt.Print("restored: ", string(notes))
	// The first node can no longer save.
	if _, err := v.Save(ctx, ws, 1); err != nil {
		fmt.Println(err)
	}
	// Output:
	// saved 1 file in 1 object
	// restored: work in progress
	// save workspace sessions/s1/workspace/: mount: workspace was saved by a newer owner (fence 2 > 1)
}
