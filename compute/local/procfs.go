package local

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// procStat is the part of /proc/<pid>/stat the provider needs.
type procStat struct {
	state byte // R, S, D, Z, ...
	ppid  int
	pgid  int
}

// zombie reports whether the process has exited and waits to be reaped.
func (s procStat) zombie() bool { return s.state == 'Z' || s.state == 'X' }

// readStat reads /proc/<pid>/stat. The command name may contain spaces and
// parentheses, so the fields are parsed after the last ')'.
func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, errors.New("malformed stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 || len(f[0]) != 1 {
		return procStat{}, errors.New("malformed stat")
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procStat{}, err
	}
	pgid, err := strconv.Atoi(f[2])
	if err != nil {
		return procStat{}, err
	}
	return procStat{state: f[0][0], ppid: ppid, pgid: pgid}, nil
}

// namespaceInit reports whether pid is the init (pid 1) of a pid namespace
// nested in ours: bubblewrap's reaper inside the sandbox. Its NSpid line
// lists the pid in every namespace from ours inwards.
func namespaceInit(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "NSpid:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		return len(f) >= 2 && f[len(f)-1] == "1"
	}
	return false
}

// allPids lists every process visible in /proc.
func allPids() []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	pids := make([]int, 0, len(ents))
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	return pids
}

// treeMembers returns root and its descendants (when withTree) plus every
// process in process group pgid (when pgid > 0), from one scan of /proc.
// It is the fallback used when the provider has no cgroups; root must not
// have been reaped yet, or its pid could belong to someone else.
func treeMembers(root int, withTree bool, pgid int) []int {
	type node struct{ ppid, pgid int }
	nodes := make(map[int]node)
	for _, pid := range allPids() {
		st, err := readStat(pid)
		if err != nil || st.zombie() {
			continue
		}
		nodes[pid] = node{st.ppid, st.pgid}
	}
	in := make(map[int]bool)
	if withTree {
		if _, ok := nodes[root]; ok {
			in[root] = true
		}
		// Repeat until no new descendant is found; the tree is shallow.
		for changed := true; changed; {
			changed = false
			for pid, n := range nodes {
				if !in[pid] && in[n.ppid] {
					in[pid] = true
					changed = true
				}
			}
		}
	}
	if pgid > 0 {
		for pid, n := range nodes {
			if n.pgid == pgid {
				in[pid] = true
			}
		}
	}
	out := make([]int, 0, len(in))
	for pid := range in {
		out = append(out, pid)
	}
	return out
}

// alive filters out pids that are gone or zombies.
func alive(pids []int) []int {
	out := pids[:0:0]
	for _, pid := range pids {
		if st, err := readStat(pid); err == nil && !st.zombie() {
			out = append(out, pid)
		}
	}
	return out
}

// kill sends sig to pid, treating a process that is already gone as success.
func kill(pid int, sig syscall.Signal) error {
	if err := unix.Kill(pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	return nil
}

// waitExited blocks until the child pid has exited without reaping it, so
// its pid cannot be reused while the provider still signals by pid.
func waitExited(pid int) error {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
