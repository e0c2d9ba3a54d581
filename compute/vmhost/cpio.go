package vmhost

import (
	"bytes"
	"fmt"
	"path"
	"sort"
)

// cpio builds a newc cpio archive with fixed owners, times and inode
// numbers, so that the same entries give the same bytes.
type cpio struct {
	entries map[string]cpioEntry
}

type cpioEntry struct {
	mode uint32
	data []byte
}

const (
	sIFDIR = 0o040000
	sIFREG = 0o100000
	sIFLNK = 0o120000
)

func newCpio() *cpio { return &cpio{entries: make(map[string]cpioEntry)} }

func (c *cpio) dir(name string, perm uint32) { c.entries[name] = cpioEntry{mode: sIFDIR | perm} }

func (c *cpio) file(name string, data []byte, perm uint32) {
	c.entries[name] = cpioEntry{mode: sIFREG | perm, data: data}
}

func (c *cpio) symlink(name, target string) {
	c.entries[name] = cpioEntry{mode: sIFLNK | 0o777, data: []byte(target)}
}

// bytes returns the archive, parents before children.
func (c *cpio) bytes() []byte {
	names := make([]string, 0, len(c.entries))
	for n := range c.entries {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		di, dj := depth(names[i]), depth(names[j])
		if di != dj {
			return di < dj
		}
		return names[i] < names[j]
	})
	var b bytes.Buffer
	for i, n := range names {
		e := c.entries[n]
		writeCpioEntry(&b, uint32(i+1), n, e.mode, e.data)
	}
	writeCpioEntry(&b, 0, "TRAILER!!!", 0, nil)
	return b.Bytes()
}

func depth(name string) int {
	d := 0
	for name != "." && name != "/" && name != "" {
		name = path.Dir(name)
		d++
	}
	return d
}

func writeCpioEntry(b *bytes.Buffer, ino uint32, name string, mode uint32, data []byte) {
	nlink := uint32(1)
	if mode&0o170000 == sIFDIR {
		nlink = 2
	}
	fmt.Fprintf(b, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	b.WriteString(name)
	b.WriteByte(0)
	pad4(b)
	b.Write(data)
	pad4(b)
}

func pad4(b *bytes.Buffer) {
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
}
