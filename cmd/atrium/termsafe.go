package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"unicode/utf8"
)

// Text that other people wrote — session titles, user names, prompts, a
// harness's output, token names, audit details — reaches the CLI's terminal.
// A terminal obeys the control characters in what it is sent: an escape
// sequence can write the clipboard (OSC 52), rename the window, erase or
// rewrite lines already shown (CR, CSI), or reorder text (bidi overrides).
// So the CLI shows every such character as a visible escape instead:
// safeText and safeLine for the strings it prints, and safeWriter around its
// terminal output as the last line of defence.

// unsafeRune reports whether r must not reach a terminal as it is: C0 and C1
// controls other than newline and tab, DEL, and the bidirectional overrides
// and isolates.
func unsafeRune(r rune) bool {
	switch {
	case r == '\n' || r == '\t':
		return false
	case r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069, r == 0x200e, r == 0x200f:
		return true
	}
	return false
}

// escapeRune is how an unsafe rune is shown; valid inside a JSON string too.
func escapeRune(b *strings.Builder, r rune) {
	fmt.Fprintf(b, `\u%04x`, r)
}

// safeText returns s with every control character but newline and tab shown
// as an escape, and "\r\n" as "\n". Invalid UTF-8 bytes are shown as \xNN.
func safeText(s string) string {
	if isSafe(s, true) {
		return s
	}
	var b strings.Builder
	writeSafe(&b, s, true)
	return b.String()
}

// safeLine is safeText for a string that must stay on one line: newlines and
// tabs are escaped too.
func safeLine(s string) string {
	if isSafe(s, false) {
		return s
	}
	var b strings.Builder
	writeSafe(&b, s, false)
	return b.String()
}

func isSafe(s string, multiline bool) bool {
	for _, r := range s {
		if r == utf8.RuneError || unsafeRune(r) || !multiline && (r == '\n' || r == '\t') {
			return false
		}
	}
	return true
}

func writeSafe(b *strings.Builder, s string, multiline bool) {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(b, `\x%02x`, s[i])
		case r == '\r' && multiline && strings.HasPrefix(s[i+1:], "\n"):
			// "\r\n": the newline alone.
		case r == '\n' && !multiline:
			b.WriteString(`\n`)
		case r == '\t' && !multiline:
			b.WriteString(`\t`)
		case unsafeRune(r):
			escapeRune(b, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
}

// safeWriter passes what is written to it through safeText. A rune split
// between two writes is held until the next one.
type safeWriter struct {
	mu   sync.Mutex
	w    io.Writer
	held []byte // guarded by mu: the start of a rune split across writes
}

func newSafeWriter(w io.Writer) *safeWriter { return &safeWriter{w: w} }

func (s *safeWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	buf := append(s.held, p...)
	s.held = nil
	// Hold back an incomplete rune at the end (at most 3 bytes).
	for k := 1; k <= 3 && k <= len(buf); k++ {
		if utf8.RuneStart(buf[len(buf)-k]) {
			if !utf8.FullRune(buf[len(buf)-k:]) {
				s.held = append([]byte(nil), buf[len(buf)-k:]...)
				buf = buf[:len(buf)-k]
			}
			break
		}
	}
	if _, err := io.WriteString(s.w, safeText(string(buf))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// safeOutput returns w if it is a safeWriter, else a safeWriter around it:
// for the commands that show other people's text live (attach, send --wait,
// invoke), whatever their output is.
func safeOutput(w io.Writer) io.Writer {
	if _, ok := w.(*safeWriter); ok {
		return w
	}
	return newSafeWriter(w)
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
