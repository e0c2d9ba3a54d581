package actor

import (
	"bytes"
	"io"
	"os"
	"testing"
)

// TestSpool keeps small copies in memory and spills large ones to a
// temporary file it removes, returning the same bytes either way.
func TestSpool(t *testing.T) {
	for name, size := range map[string]int{"small": 1000, "at the limit": spoolMemory, "large": spoolMemory + 12345} {
		t.Run(name, func(t *testing.T) {
			want := bytes.Repeat([]byte("0123456789abcdef"), size/16+1)[:size]
			var sp spool
			for chunk := want; len(chunk) > 0; {
				n := min(len(chunk), 64<<10)
				if _, err := sp.Write(chunk[:n]); err != nil {
					t.Fatal(err)
				}
				chunk = chunk[n:]
			}
			r, n, err := sp.reader()
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(r)
			if err != nil || n != int64(size) || !bytes.Equal(got, want) {
				t.Fatalf("read back %d bytes (size %d, %v), want %d", len(got), n, err, size)
			}
			if spilled := sp.f != nil; spilled != (size > spoolMemory) {
				t.Errorf("spilled to a file: %v, for %d bytes", spilled, size)
			}
			sp.close()
			if sp.f != nil {
				if _, err := os.Stat(sp.f.Name()); !os.IsNotExist(err) {
					t.Errorf("temporary file %s left behind: %v", sp.f.Name(), err)
				}
			}
		})
	}
}
