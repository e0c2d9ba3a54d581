package sqlite

// WriteNewNamed exposes writeNew's fallback, which the filesystems the tests
// run on never need.
var WriteNewNamed = writeNewNamed

// HasPromptSet reports whether l answers PromptSeq from its prompt set.
func HasPromptSet(l *Log) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.prompts != nil
}

const PromptSetAfter = promptSetAfter

// Synchronous returns the writer connection's PRAGMA synchronous (0 OFF, 1
// NORMAL, 2 FULL) and whether the next commit may run without syncs.
func Synchronous(l *Log) (mode int, quietStart bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	err = l.writer.QueryRow(`PRAGMA synchronous`).Scan(&mode)
	return mode, l.quietStart, err
}

// ReaderConns returns how many read connections l has open.
func ReaderConns(l *Log) int { return l.readers.Stats().OpenConnections }
