package remote

import "github.com/atriumhq/atrium/compute"

// Buffered returns how many bytes of pr's stdout and stderr the provider
// holds unread.
func Buffered(pr compute.Process) (stdout, stderr int64) {
	p := pr.(*Process)
	size := func(b *streamBuf) int64 {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.size
	}
	return size(p.stdout), size(p.stderr)
}
