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
