// Package local is the embedded compute provider: it runs one sandbox per
// session on this host, each harness command under bubblewrap (bwrap), with
// the session's workspace directory <Config.Dir>/<session>/workspace bound
// at /workspace. It implements compute.Provider, compute.Sandbox and
// compute.Process.
//
// # Security
//
// A harness runs code an AI agent chose, so the sandbox assumes it is
// hostile. Each sandbox gets (see Zygote below for how commands share it):
//
//   - New user, pid, mount, network, ipc, uts and cgroup namespaces
//     (--unshare-all). Inside, the harness is uid/gid 1000, which maps to the
//     uid atrium runs as: files it creates in /workspace belong to atrium on
//     the host, so they stay readable and writable across turns and atrium
//     can save and delete them. Nested user namespaces are refused
//     (--disable-userns): they are the usual first step of kernel exploits
//     and no harness needs them.
//   - No capabilities (--cap-drop ALL) and no_new_privs (always set by
//     bubblewrap), so setuid binaries grant nothing.
//   - No network: the sandbox's network namespace holds only loopback, which
//     does not reach the host's loopback services. compute.Spec.Network
//     shares the host's network instead (and its /etc/resolv.conf);
//     compute.Spec.Egress keeps the network off but lets HTTP(S) reach the
//     listed hosts through a proxy (see Egress below).
//   - A read-only system: /usr (and the /bin, /lib, /lib64, /sbin links of a
//     merged-/usr system) bound read-only, and a synthesized read-only /etc
//     that holds only what programs need to run (dynamic linker cache, name
//     service switch, hosts, time zone, CA certificates, shell profiles,
//     alternatives) plus generated passwd and group files. The host's
//     /etc/shadow, SSH keys, TLS private keys, package manager credentials
//     and everything else in /etc are absent, as are /home, /root, /var,
//     /run and /sys. This matters because the sandbox's uid is atrium's uid
//     (root, typically) on the host: anything bound in is accessible with
//     that uid's file permissions.
//   - Only /workspace and a private /tmp (tmpfs, counted against the memory
//     limit) are writable; the root is remounted read-only.
//   - A private /proc showing only the sandbox's processes, and a minimal
//     /dev (null, zero, full, random, urandom, tty, pts, shm).
//   - A new session (--new-session), so it cannot push input into atrium's
//     terminal (TIOCSTI), and --die-with-parent, so the sandbox dies with the
//     bwrap process the provider watches.
//   - Only PATH, HOME=/workspace, LANG=C.UTF-8 and TERM=dumb plus the
//     request's Env: the host environment, which holds atrium's own secrets,
//     is never inherited. Env travels through the process environment, never
//     the command line, so other host users cannot read it from ps.
//   - Memory (without swap), process-count and CPU limits for the whole
//     sandbox from a cgroup per session (v1 or v2, whichever the host has;
//     CPU time through CFS bandwidth control: cpu.max on v2,
//     cpu.cfs_quota_us over a 100 ms cpu.cfs_period_us on v1, so a sandbox
//     limited to 0.5 CPUs runs at most 50 ms of every 100 ms). Each
//     command runs in a leaf cgroup of its own below it, which it enters
//     before it execs (so it cannot fork before it is limited). The leaf
//     cgroup also tells which processes belong to the command (for Signal
//     and kill) and whether the kernel's OOM killer struck it.
//
// # Zygote
//
// Building a sandbox (namespaces, mounts) costs bubblewrap 10–25 ms, too
// much to pay per command. So the first command of a sandbox starts one
// long-lived bubblewrap with the isolation above, whose payload is the
// zygote: the atrium executable itself (Config.Forwarder), not bound into
// the sandbox but inherited as an open file and run through
// /proc/self/fd/4, in a cgroup of its own beside the sandbox's
// (<session>.zygote: the kernel's OOM killer never picks it for a
// command's excess). It is not dumpable, so commands, which run as its
// uid, cannot ptrace it or read its memory. It takes requests (argv, environment, working directory, the
// three stdio pipes) over a Unix socket pair and forks each command in the
// sandbox's existing namespaces, as uid 1000 in a session and process
// group of its own, through /bin/sh's exec as before. The forked shell
// waits until the host has read the command's host pid from the pidfd the
// zygote passes back and moved it into the command's leaf cgroup; only
// then does it exec the command. The exit status comes back over the
// request's socket. Every binary linking this package acts as the zygote
// when started as one (the package's init function checks os.Args), so
// atrium and test binaries need nothing in main; the provider checks it
// once with `atrium-sandbox-zygote -probe`.
//
// What differs from a bubblewrap per command: the commands of one sandbox
// share its pid, mount, network and ipc namespaces, so they see (in
// /proc) and can signal each other and the zygote; the egress forwarder
// starts once per zygote instead of once per command; the zygote's own
// few processes and ~10–20 MB are not counted against the sandbox's
// limits (commands' processes and memory are, /tmp included). A
// zygote that dies (a command may kill it) takes the sandbox's running
// commands with it: they end with compute.Exit.Lost, and the next command
// starts a new zygote. Sleep, Destroy and Close stop it. A zygote is also
// replaced, once no command runs in it, when the sandbox's network or
// egress settings change or the workspace directory was replaced (a
// restore swaps a new tree in at its path); while commands still run in
// the old one, new commands start their own bubblewrap.
//
// Fallback: when the executable does not act as a zygote, or a zygote
// cannot start or stops answering, commands run as before, each in a
// bubblewrap of its own (new namespaces per command, the leaf cgroup
// entered by a tiny /bin/sh wrapper that writes its pid to cgroup.procs
// and then execs bwrap); the provider logs why.
//
// When the host has no usable cgroups the provider logs one warning at New
// and runs sandboxes without limits; a command's processes are then found
// through the process tree. A missing controller (say, no cpu controller)
// only removes its limit, with a warning naming it.
//
// # Egress
//
// A sandbox opened with compute.Spec.Egress (host names, "*.example.com"
// wildcards, IP addresses, optional ":port"; see compute/egress) still has
// no network of its own. The provider runs one egress proxy per sandbox
// (egress.Proxy), listening on a Unix socket <Config.Dir>/<session>/egress.sock
// that only that sandbox has bound in (at /run/atrium/egress.sock), so the
// proxy knows which sandbox asks without trusting anything it says. It
// forwards http:// requests and tunnels CONNECT (https) to listed hosts,
// resolving names on the host, and answers anything else with 403 and a body
// naming the refused host and the allowlist; denials are logged with the
// host only. The proxy starts with the sandbox, takes a new allowlist from
// a later Open at once, and stops (closing its tunnels) when the sandbox
// sleeps or is destroyed.
//
// Inside, programs find it at HTTP_PROXY=HTTPS_PROXY=http://127.0.0.1:3128
// (Config.EgressPort; also http_proxy, https_proxy, and NO_PROXY for
// loopback). The sandbox has its own network namespace, so the /bin/sh
// that starts the zygote (or, without one, each command's) first starts
// the forwarder (the atrium executable
// itself, Config.Forwarder, bound read-only at
// /run/atrium/atrium-egress-forward), which listens on that port, relays
// connections to the socket, ignores the signals meant for the command and
// dies with the sandbox's pid namespace; the command starts once it
// listens. Its main must begin with the egress.IsForwarder check (atrium's
// does; a test binary's TestMain must too): Open checks this once with
// `-probe` and fails with session.ErrUnavailable if not. Programs that
// ignore the proxy variables, resolve names themselves, or speak other
// protocols (ssh to port 22) get no connection: the sandbox has no DNS and
// no route.
//
// In unsafe mode the allowlist is not enforced: commands have the host's
// network. The proxy then listens on the host's loopback and the variables
// point at it, so programs that honour them see the same answers as in a
// sandbox; the provider logs a warning once.
//
// If bubblewrap is not installed, New succeeds but Open fails with an error
// matching session.ErrUnavailable that says how to install it. Config.Unsafe
// (--unsafe-no-sandbox) instead runs commands directly on the host with the
// workspace as working directory and HOME, the same minimal environment and
// the cgroup limits, in a process group and session of their own so that
// signals reach their children. It isolates nothing and is meant for
// development machines without bubblewrap.
//
// # Processes
//
// Stdin, stdout and stderr are plain pipes handed to the command: output is
// never buffered by the provider, and a harness that writes faster than the
// caller reads is slowed down by the pipe. Signal delivers a signal to every
// process of the command (with a bubblewrap per command, all but its
// monitor and the sandbox's init), so a harness can trap SIGTERM and clean
// up; SIGKILL kills them all and returns once none is left.
//
// When the harness exits, the provider kills what is left of its leaf
// cgroup (without cgroups: its process tree and process group; with a
// bubblewrap per command, the command's pid namespace ends with it).
// Without cgroups, a process of a zygote's command that starts a session
// of its own escapes that and lives until the zygote stops (sleep,
// destroy); with cgroups nothing escapes. bubblewrap's monitor does not
// reap the sandbox's init. When atrium runs as root the
// monitor is itself the init of a pid namespace of its own, so the sandbox's
// init dies and is reaped with it; otherwise the host's init reaps it, and
// atrium must not run as pid 1 of a container without an init (use docker
// run --init).
//
// bubblewrap reports a command killed by signal N as exit status 128+N, as
// shells do; the provider decodes that into compute.Exit.Signal, for a
// command of a zygote too, so that both paths report alike.
package local
