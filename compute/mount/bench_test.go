package mount_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

// benchWorkspace writes 10,000 files of 10,000 bytes (100 MB) in 100
// directories.
func benchWorkspace(b *testing.B, root string) {
	b.Helper()
	data := blobtest.Random(10_000 * 100)
	for d := range 100 {
		for f := range 100 {
			off := f * 10_000
			// Distinct content per file: the directory number in front.
			content := append(fmt.Appendf(nil, "%03d", d), data[off+3:off+10_000]...)
			writeFile(b, root, fmt.Sprintf("dir%03d/file%03d", d, f), content, 0o644, old)
		}
	}
}

// BenchmarkRestore restores a 100 MB, 10,000-file workspace from versitygw
// on loopback into an empty directory, as a new VM would.
func BenchmarkRestore(b *testing.B) {
	srv := blobtest.StartS3(b)
	for _, presigned := range []bool{false, true} {
		be := backend{name: "s3", store: srv.Open(b, fmt.Sprintf("bench-%v/", presigned)), srv: srv, presigned: presigned}
		name := map[bool]string{false: "direct", true: "presigned"}[presigned]
		b.Run(name, func(b *testing.B) {
			src := filepath.Join(b.TempDir(), "ws")
			benchWorkspace(b, src)
			v := be.volume("sessions/bench/workspace/")
			mustRestore(b, v, be.workspace(b, src), 0)
			st := mustSave(b, v, be.workspace(b, src), 0)
			b.Logf("saved %d files, %d bytes in %d objects in %v", st.Files, st.Bytes, st.ObjectsWritten, st.Duration)
			dir := b.TempDir()
			n := 0
			b.SetBytes(st.Bytes)
			for b.Loop() {
				n++
				dst := filepath.Join(dir, fmt.Sprint(n), "ws")
				rst := mustRestore(b, be.volume("sessions/bench/workspace/"), be.workspace(b, dst), 0)
				if rst.Files != 10_000 {
					b.Fatalf("restored %d files", rst.Files)
				}
				b.ReportMetric(float64(rst.ObjectsRead), "objects/op")
			}
		})
	}
}

// BenchmarkSaveIncremental saves the 100 MB, 10,000-file workspace after
// changing one file in it.
func BenchmarkSaveIncremental(b *testing.B) {
	srv := blobtest.StartS3(b)
	for _, presigned := range []bool{false, true} {
		be := backend{name: "s3", store: srv.Open(b, fmt.Sprintf("bench-%v/", presigned)), srv: srv, presigned: presigned}
		name := map[bool]string{false: "direct", true: "presigned"}[presigned]
		b.Run(name, func(b *testing.B) {
			src := filepath.Join(b.TempDir(), "ws")
			benchWorkspace(b, src)
			v := be.volume("sessions/bench/workspace/")
			mustRestore(b, v, be.workspace(b, src), 0)
			mustSave(b, v, be.workspace(b, src), 0)
			n := 0
			var st mount.Stats
			for b.Loop() {
				n++
				writeFile(b, src, "dir042/file042", blobtest.Random(10_000), 0o644, old.Add(time.Duration(n)*time.Second))
				st = mustSave(b, v, be.workspace(b, src), 0)
				if st.ObjectsWritten != 1 || st.Hashed != 1 {
					b.Fatalf("incremental save: %+v", st)
				}
			}
			b.ReportMetric(float64(st.ManifestBytes), "manifest-bytes")
		})
	}
	_ = context.Background
}
