package actor

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"unicode/utf8"

	"github.com/atriumhq/atrium/session"
)

// textBuf coalesces one stream's output into valid UTF-8 text of at most
// limit bytes per event. Invalid bytes become U+FFFD; a rune split across two
// reads is kept whole.
type textBuf struct {
	limit   int
	pending []byte // valid UTF-8 not yet emitted
	carry   []byte // the start of a rune whose remaining bytes have not arrived
}

// add appends raw output and returns the texts that are full (limit bytes,
// cut at a rune boundary); the rest stays pending.
func (b *textBuf) add(raw []byte) (full []string) {
	data := raw
	if len(b.carry) > 0 {
		data = append(b.carry, raw...)
		b.carry = nil
	}
	cut := len(data)
	for i := len(data) - 1; i >= 0 && i >= len(data)-utf8.UTFMax+1; i-- {
		if utf8.RuneStart(data[i]) {
			if !utf8.FullRune(data[i:]) {
				cut = i
			}
			break
		}
	}
	if cut < len(data) {
		b.carry = append([]byte(nil), data[cut:]...)
	}
	b.pending = appendValid(b.pending, data[:cut])
	return b.split()
}

// split cuts full texts off the front of pending.
func (b *textBuf) split() (full []string) {
	for len(b.pending) >= b.limit {
		n := b.limit
		for n > 0 && n < len(b.pending) && !utf8.RuneStart(b.pending[n]) {
			n--
		}
		full = append(full, string(b.pending[:n]))
		b.pending = append(b.pending[:0], b.pending[n:]...)
	}
	return full
}

// take returns the pending text (which may be empty), keeping an incomplete
// trailing rune for the next add.
func (b *textBuf) take() string {
	s := string(b.pending)
	b.pending = b.pending[:0]
	return s
}

// end returns everything left, an incomplete trailing rune as U+FFFD.
func (b *textBuf) end() []string {
	b.pending = appendValid(b.pending, b.carry)
	b.carry = nil
	out := b.split()
	if t := b.take(); t != "" {
		out = append(out, t)
	}
	return out
}

func (b *textBuf) empty() bool { return len(b.pending) == 0 }

// appendValid appends src to dst with each run of invalid UTF-8 replaced by
// U+FFFD.
func appendValid(dst, src []byte) []byte {
	if utf8.Valid(src) {
		return append(dst, src...)
	}
	return append(dst, bytes.ToValidUTF8(src, []byte("\uFFFD"))...)
}

// piece is a part of the harness's stdout: a whole line (which may be a
// harness object) or a part of a line too long to be one.
type piece struct {
	data  []byte
	whole bool // a complete line of at most MaxOutputEventBytes, newline included if there was one
}

// readLines reads r into pieces until EOF. A line longer than the buffer is
// delivered in parts that are never parsed as JSON.
func readLines(r io.Reader, out chan<- piece) {
	defer close(out)
	br := bufio.NewReaderSize(r, session.MaxOutputEventBytes)
	long := false
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			complete := line[len(line)-1] == '\n' || err == io.EOF
			out <- piece{data: bytes.Clone(line), whole: complete && !long}
			long = !complete
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return
		}
	}
}

// readChunks reads r into chunks until EOF.
func readChunks(r io.Reader, out chan<- []byte) {
	defer close(out)
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			out <- bytes.Clone(buf[:n])
		}
		if err != nil {
			return
		}
	}
}
