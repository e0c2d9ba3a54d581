package egress

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// ForwarderName is the name under which an executable acts as the egress
// forwarder: a program whose argv[0] ends in it runs RunForwarder instead of
// its usual main. compute/local binds the atrium executable into a sandbox
// under this name.
const ForwarderName = "atrium-egress-forward"

// ForwarderProbeOutput is what `atrium-egress-forward -probe` prints: proof
// that an executable handles the forwarder role.
const ForwarderProbeOutput = ForwarderName + " ok\n"

// ForwarderReady is what the forwarder prints on its standard output once
// it listens, before it closes it.
const ForwarderReady = "ready"

// forwarderDialTimeout bounds connecting to the node's proxy.
const forwarderDialTimeout = 10 * time.Second

// IsForwarder reports whether a process started with args (os.Args) is the
// egress forwarder. A program that runs local sandboxes with egress
// allowlists (atrium, and test binaries that do) starts its main with
//
//	if egress.IsForwarder(os.Args) {
//		os.Exit(egress.RunForwarder(os.Args, os.Stdout, os.Stderr))
//	}
func IsForwarder(args []string) bool {
	return len(args) > 0 && filepath.Base(args[0]) == ForwarderName
}

// RunForwarder is the egress forwarder's main; it returns the exit status.
// Inside a sandbox, whose network namespace has only loopback, the
// sandbox's shell runs
//
//	ready=$(atrium-egress-forward -listen 127.0.0.1:3128 -socket /run/atrium/egress.sock &)
//
// The forwarder listens on the TCP address, ignores from then on the
// signals that a harness's cancellation sends to every process of the
// command, prints ForwarderReady and closes its standard streams (which
// ends the shell's wait, so the command started next finds the proxy
// ready), then relays every connection to the Unix socket, where the
// node's Proxy answers, until the sandbox's pid namespace ends with the
// command. `-probe` prints ForwarderProbeOutput and exits: the node checks
// with it that the executable it binds handles this role. RunForwarder
// takes over the process's standard streams: it is a main.
func RunForwarder(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(ForwarderName, flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "", "TCP address to listen on, inside the sandbox")
	socket := fs.String("socket", "", "Unix socket of the node's egress proxy")
	probe := fs.Bool("probe", false, "print "+ForwarderName+" ok and exit")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "atrium: cannot start the egress proxy forwarder: %v\n", err)
		return 1
	}
	switch {
	case *probe:
		io.WriteString(stdout, ForwarderProbeOutput)
		return 0
	case *socket == "":
		return fail(errors.New("-socket is required"))
	case *listen == "":
		return fail(errors.New("-listen is required"))
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fail(err)
	}
	signal.Ignore(ignoredSignals...)
	// Out of the command's process group, so that a harness killing its
	// group does not take the proxy away from what it starts later.
	_, _ = syscall.Setsid()
	if _, err := io.WriteString(stdout, ForwarderReady+"\n"); err != nil {
		return fail(err)
	}
	if err := detachStdio(); err != nil {
		return fail(err)
	}
	if err := serveForward(ln, *socket); err != nil {
		return 1
	}
	return 0
}

// detachStdio points the process's standard streams at /dev/null, so that
// it holds none of the command's pipes open.
func detachStdio() error {
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer null.Close()
	for fd := 0; fd <= 2; fd++ {
		if err := syscall.Dup3(int(null.Fd()), fd, 0); err != nil {
			return fmt.Errorf("detach fd %d: %w", fd, err)
		}
	}
	return nil
}

// ignoredSignals are the signals that would end or stop the forwarder by
// default.
var ignoredSignals = func() []os.Signal {
	sigs := []os.Signal{
		syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGUSR1,
		syscall.SIGUSR2, syscall.SIGPIPE, syscall.SIGALRM, syscall.SIGTSTP, syscall.SIGTTIN,
		syscall.SIGTTOU, syscall.SIGXCPU, syscall.SIGXFSZ, syscall.SIGVTALRM, syscall.SIGIO,
		syscall.SIGPWR, syscall.SIGSTKFLT, syscall.SIGTRAP,
	}
	for s := 34; s <= 64; s++ { // real-time signals
		sigs = append(sigs, syscall.Signal(s))
	}
	return sigs
}()

// serveForward relays every connection accepted on ln to the Unix socket at
// socket, until ln is closed; it then closes the connections it relays and
// waits for them.
func serveForward(ln net.Listener, socket string) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = make(map[net.Conn]struct{})
	)
	track := func(cs ...net.Conn) {
		mu.Lock()
		for _, c := range cs {
			conns[c] = struct{}{}
		}
		mu.Unlock()
	}
	var err error
	for {
		c, aerr := ln.Accept()
		if aerr != nil {
			if !errors.Is(aerr, net.ErrClosed) {
				err = aerr
			}
			break
		}
		track(c)
		wg.Go(func() {
			defer func() {
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
				c.Close()
			}()
			up, err := net.DialTimeout("unix", socket, forwarderDialTimeout)
			if err != nil {
				return // The sandbox is stopping: the client sees the close.
			}
			track(up)
			defer func() {
				mu.Lock()
				delete(conns, up)
				mu.Unlock()
			}()
			pipe(c, c, up)
		})
	}
	ln.Close()
	mu.Lock()
	for c := range conns {
		c.Close()
	}
	mu.Unlock()
	wg.Wait()
	return err
}
