package vmhost

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/atriumhq/atrium/compute/remote"
)

// ImageFormat is the version of the image layout and guest init; an image
// of another format is refused.
const ImageFormat = 5

// KernelMeta is the Debian package whose dependency names the guest kernel.
const KernelMeta = "linux-image-cloud-amd64"

// guestPackages are the Debian packages the initramfs is made of, besides
// the kernel: busybox, bubblewrap and bash (the "shell" harness runs
// `bash -lc`) with their shared libraries.
var guestPackages = []string{"busybox-static", "bubblewrap", "bash", "libtinfo6", "libc6", "libcap2", "libselinux1", "libpcre2-8-0",
	"libstdc++6", "libgcc-s1"} // the last two for node, on the tools disk

// guestModules are the kernel modules the init loads, in this order
// (virtio_ring before virtio: the order of dependencies).
var guestModules = []string{
	"kernel/drivers/virtio/virtio_ring.ko",
	"kernel/drivers/virtio/virtio.ko",
	"kernel/drivers/virtio/virtio_mmio.ko",
	"kernel/drivers/block/virtio_blk.ko",
	"kernel/net/core/failover.ko",
	"kernel/drivers/net/net_failover.ko",
	"kernel/drivers/net/virtio_net.ko",
	"kernel/drivers/char/hw_random/virtio-rng.ko",
}

// Image file names inside an image directory.
const (
	manifestFile  = "manifest.json"
	kernelFile    = "vmlinuz"
	initramfsFile = "initramfs.gz"
	// toolsFile is the read-only tools disk (node and the installed
	// agents), present when the image was built with agents.
	toolsFile = "tools.img"
)

// ToolsPath is where the guest mounts the tools disk: node is
// ToolsPath/bin/node (also /usr/local/bin/node) and agent NAME at VERSION
// is ToolsPath/NAME/VERSION, the layout of a node's agents install. It is
// under /usr, which sandboxes in the guest see read-only.
const ToolsPath = remote.DefaultVMAgentsDir

// toolsLabel is the tools disk's file system label, by which the guest
// tells it from the workspace disk.
const toolsLabel = "atrium-tools"

// Manifest describes a built image; it is DIR/manifest.json.
type Manifest struct {
	Format int `json:"format"`
	// Version is the version of the atrium binary inside.
	Version string `json:"version"`
	// Key hashes every input (packages, binary, format): a build with the
	// same key is skipped.
	Key       string   `json:"key"`
	Kernel    string   `json:"kernel"`
	Packages  []string `json:"packages"`
	Atrium    string   `json:"atrium_sha256"`
	Initramfs string   `json:"initramfs_sha256"`
	// Node and Agents say what the tools disk holds (node's version,
	// agents as NAME/VERSION); empty without one.
	Node   string   `json:"node,omitempty"`
	Agents []string `json:"agents,omitempty"`
}

// BuildConfig configures Build.
type BuildConfig struct {
	// Dir receives the image (vmlinuz, initramfs.gz, manifest.json).
	Dir string
	// Atrium is a statically linked atrium binary to run in the guest.
	Atrium string
	// Version is the version of that binary, recorded in the manifest.
	Version string
	// Agents is a node's agents install (`atrium agents install`: the
	// data dir's agents/, /var/cache/atrium-agents in CI): when set, the
	// image gets a read-only tools disk holding it and node, mounted at
	// ToolsPath in every VM, so agent sessions can run in VMs.
	Agents string
	// Node is the node binary for the tools disk; default the node on
	// PATH. Its shared libraries come from Debian's packages.
	Node string
	// Progress receives one line per step; may be nil.
	Progress io.Writer
}

// Build builds the guest image from Debian packages (apt-get download,
// dpkg-deb -x) and cfg.Atrium. It is reproducible: the same inputs give the
// same bytes; and it does nothing when cfg.Dir holds an image of the same
// inputs.
func Build(ctx context.Context, cfg BuildConfig) (Manifest, error) {
	say := func(format string, a ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "vmhost image: "+format+"\n", a...)
		}
	}
	if cfg.Dir == "" || cfg.Atrium == "" {
		return Manifest{}, errors.New("vmhost image: Dir and Atrium are required")
	}
	if err := checkStatic(cfg.Atrium); err != nil {
		return Manifest{}, err
	}
	for _, tool := range []string{"apt-get", "apt-cache", "dpkg-deb"} {
		if _, err := exec.LookPath(tool); err != nil {
			return Manifest{}, fmt.Errorf("vmhost image: %s is not installed (the image is built from Debian packages)", tool)
		}
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return Manifest{}, fmt.Errorf("vmhost image: %w", err)
	}
	work, err := os.MkdirTemp(cfg.Dir, ".build-")
	if err != nil {
		return Manifest{}, fmt.Errorf("vmhost image: %w", err)
	}
	defer os.RemoveAll(work)

	kernelPkg, err := kernelPackage(ctx)
	if err != nil {
		return Manifest{}, err
	}
	pkgs := append([]string{kernelPkg}, guestPackages...)
	debs := filepath.Join(work, "debs")
	if err := os.Mkdir(debs, 0o755); err != nil {
		return Manifest{}, err
	}
	// _apt must be able to write the download directory.
	os.Chmod(work, 0o755)
	os.Chmod(debs, 0o777)
	say("downloading %s", strings.Join(pkgs, " "))
	start := time.Now()
	if out, err := command(ctx, debs, "apt-get", append([]string{"download", "-q"}, pkgs...)...); err != nil {
		return Manifest{}, fmt.Errorf("vmhost image: apt-get download: %w: %s (run apt-get update?)", err, out)
	}
	entries, err := os.ReadDir(debs)
	if err != nil {
		return Manifest{}, err
	}
	var names []string
	key := sha256.New()
	fmt.Fprintf(key, "format %d\n", ImageFormat)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".deb") {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	for _, n := range names {
		h, err := fileSHA256(filepath.Join(debs, n))
		if err != nil {
			return Manifest{}, err
		}
		fmt.Fprintf(key, "%s %s\n", n, h)
	}
	atriumSum, err := fileSHA256(cfg.Atrium)
	if err != nil {
		return Manifest{}, err
	}
	fmt.Fprintf(key, "atrium %s %s\n", atriumSum, cfg.Version)
	var tools *toolsInput
	if cfg.Agents != "" {
		if tools, err = readTools(ctx, cfg.Agents, cfg.Node); err != nil {
			return Manifest{}, err
		}
		fmt.Fprintf(key, "tools %s\n", tools.key)
	}
	keyHex := hex.EncodeToString(key.Sum(nil))
	say("downloaded %d packages in %s", len(names), time.Since(start).Round(time.Millisecond))
	if m, err := ReadManifest(cfg.Dir); err == nil && m.Key == keyHex {
		say("image in %s is up to date (key %s)", cfg.Dir, keyHex[:12])
		return m, nil
	}

	root := filepath.Join(work, "root")
	for _, n := range names {
		say("extracting %s", n)
		if out, err := command(ctx, "", "dpkg-deb", "-x", filepath.Join(debs, n), root); err != nil {
			return Manifest{}, fmt.Errorf("vmhost image: dpkg-deb -x %s: %w: %s", n, err, out)
		}
	}
	kver := strings.TrimSuffix(strings.TrimPrefix(kernelPkg, "linux-image-"), "")
	say("making the initramfs (kernel %s)", kver)
	var ird bytes.Buffer
	if err := writeInitramfs(&ird, root, kver, cfg.Atrium); err != nil {
		return Manifest{}, err
	}
	kernelSrc := filepath.Join(root, "boot", "vmlinuz-"+kver)
	if err := copyFile(kernelSrc, filepath.Join(work, kernelFile)); err != nil {
		return Manifest{}, fmt.Errorf("vmhost image: kernel: %w", err)
	}
	if err := os.WriteFile(filepath.Join(work, initramfsFile), ird.Bytes(), 0o644); err != nil {
		return Manifest{}, err
	}
	irdSum := sha256.Sum256(ird.Bytes())
	m := Manifest{
		Format: ImageFormat, Version: cfg.Version, Key: keyHex, Kernel: kver,
		Packages: names, Atrium: atriumSum, Initramfs: hex.EncodeToString(irdSum[:]),
	}
	files := []string{kernelFile, initramfsFile, manifestFile}
	if tools != nil {
		say("making the tools disk: node %s, agents %s (%d MiB)", tools.nodeVersion, strings.Join(tools.agents, " "), tools.bytes>>20)
		if err := tools.make(ctx, filepath.Join(work, toolsFile)); err != nil {
			return Manifest{}, err
		}
		m.Node, m.Agents = tools.nodeVersion, tools.agents
		files = append([]string{toolsFile}, files...)
	} else {
		os.Remove(filepath.Join(cfg.Dir, toolsFile))
	}
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := os.WriteFile(filepath.Join(work, manifestFile), append(b, '\n'), 0o644); err != nil {
		return Manifest{}, err
	}
	// The manifest goes last: a directory whose manifest is present is a
	// complete image.
	os.Remove(filepath.Join(cfg.Dir, manifestFile))
	for _, f := range files {
		if err := os.Rename(filepath.Join(work, f), filepath.Join(cfg.Dir, f)); err != nil {
			return Manifest{}, fmt.Errorf("vmhost image: %w", err)
		}
	}
	say("built %s: kernel %s, initramfs %d MiB (sha256 %s)", cfg.Dir, kver, ird.Len()>>20, m.Initramfs[:12])
	return m, nil
}

// ReadManifest reads the manifest of the image in dir.
func ReadManifest(dir string) (Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, manifestFile))
	if err != nil {
		return Manifest{}, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return Manifest{}, fmt.Errorf("%s: %w", filepath.Join(dir, manifestFile), err)
	}
	return m, nil
}

// kernelPackage resolves KernelMeta to the versioned kernel package.
func kernelPackage(ctx context.Context) (string, error) {
	out, err := command(ctx, "", "apt-cache", "depends", KernelMeta)
	if err != nil {
		return "", fmt.Errorf("vmhost image: apt-cache depends %s: %w: %s (run apt-get update?)", KernelMeta, err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], "linux-image-") {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("vmhost image: %s depends on no linux-image package", KernelMeta)
}

// checkStatic refuses a dynamically linked binary: the guest has no libc
// for it.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("vmhost image: %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("vmhost image: %s is dynamically linked; build a static one: CGO_ENABLED=0 go build -o atrium ./cmd/atrium", path)
		}
	}
	return nil
}

func command(ctx context.Context, dir, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return bytes.TrimSpace(out), err
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

// writeInitramfs writes the gzipped newc cpio archive of the guest: busybox
// with its applets, bubblewrap and its libraries, the modules, atrium and
// the init script.
func writeInitramfs(w io.Writer, root, kver, atrium string) error {
	c := newCpio()
	for _, d := range []string{"bin", "sbin", "usr", "usr/bin", "usr/sbin", "usr/local", "usr/local/bin", "lib",
		"lib/x86_64-linux-gnu", "lib64", "lib/modules", "lib/modules/" + kver, "etc", "proc", "sys", "dev", "tmp",
		"run", "root", "var", "var/lib", "var/lib/atrium-agent", "workspace"} {
		c.dir(d, 0o755)
	}
	bb, err := os.ReadFile(filepath.Join(root, "bin/busybox"))
	if err != nil {
		return fmt.Errorf("vmhost image: busybox: %w", err)
	}
	c.file("bin/busybox", bb, 0o755)
	for _, applet := range busyboxApplets {
		c.symlink("bin/"+applet, "busybox")
	}
	// Scripts start with #!/usr/bin/env (the agents' node programs).
	c.symlink("usr/bin/env", "/bin/busybox")
	bw, err := os.ReadFile(filepath.Join(root, "usr/bin/bwrap"))
	if err != nil {
		return fmt.Errorf("vmhost image: bwrap: %w", err)
	}
	c.file("usr/bin/bwrap", bw, 0o755)
	bash, err := os.ReadFile(filepath.Join(root, "bin/bash"))
	if err != nil {
		return fmt.Errorf("vmhost image: bash: %w", err)
	}
	c.file("bin/bash", bash, 0o755)
	// Shared libraries of bubblewrap: every *.so* of the library
	// packages, as files and symlinks.
	for _, dir := range []string{"lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64"} {
		entries, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			continue
		}
		dst := dir
		if dir == "usr/lib/x86_64-linux-gnu" {
			dst = "lib/x86_64-linux-gnu"
		}
		for _, e := range entries {
			if !strings.Contains(e.Name(), ".so") {
				continue
			}
			p := filepath.Join(root, dir, e.Name())
			fi, err := os.Lstat(p)
			if err != nil {
				return err
			}
			switch {
			case fi.Mode()&fs.ModeSymlink != 0:
				t, err := os.Readlink(p)
				if err != nil {
					return err
				}
				c.symlink(dst+"/"+e.Name(), t)
			case fi.Mode().IsRegular():
				b, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				c.file(dst+"/"+e.Name(), b, 0o755)
			}
		}
	}
	var mods []string
	for _, m := range guestModules {
		b, err := os.ReadFile(filepath.Join(root, "lib/modules", kver, m))
		if err != nil {
			return fmt.Errorf("vmhost image: module: %w", err)
		}
		name := filepath.Base(m)
		c.file("lib/modules/"+kver+"/"+name, b, 0o644)
		mods = append(mods, "/lib/modules/"+kver+"/"+name)
	}
	ab, err := os.ReadFile(atrium)
	if err != nil {
		return err
	}
	c.file("usr/local/bin/atrium", ab, 0o755)
	c.file("etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
	c.file("etc/group", []byte("root:x:0:\n"), 0o644)
	c.file("etc/hostname", []byte("sandbox\n"), 0o644)
	init := strings.NewReplacer("@MODULES@", strings.Join(mods, " "), "@TOOLSLABEL@", toolsLabel, "@TOOLSPATH@", ToolsPath, "@PROXY@", GuestProxyURL).Replace(initScript)
	c.file("init", []byte(init), 0o755)
	zw, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if _, err := zw.Write(c.bytes()); err != nil {
		return err
	}
	return zw.Close()
}

// busyboxApplets are the commands the guest has, as links to busybox.
var busyboxApplets = strings.Fields(`sh ash awk base64 basename cat chmod chown cp cut date dd df dirname du echo env
expr false find grep gunzip gzip head hostname id ifconfig insmod ip kill ln ls mkdir mknod mktemp mount mv nproc
od poweroff printf ps pwd readlink realpath rm rmdir route sed seq sha256sum sleep sort stat switch_root sync tail tar
tee test touch tr true nc umount uname uniq wc which xargs yes [ [[ timeout mkfs.ext2 hexdump stty setsid nohup wget`)

// initScript is the guest's /init. In the initramfs it copies itself to a
// tmpfs and switch_roots there (bubblewrap cannot pivot_root off the
// initramfs); then it loads the virtio modules, mounts the workspace disk,
// brings up the network, waits for the VM's configuration (token, time,
// randomness) and runs the agent. A snapshot template is taken while it
// waits.
const initScript = `#!/bin/sh
export PATH=/usr/local/bin:/usr/bin:/bin
if [ ! -e /.stage2 ]; then
	/bin/busybox mount -t tmpfs -o mode=0755 root /mnt 2>/dev/null || { /bin/busybox mkdir -p /mnt; /bin/busybox mount -t tmpfs -o mode=0755 root /mnt; }
	for d in bin sbin usr lib lib64 etc root var init; do /bin/busybox cp -a /$d /mnt/; done
	for d in proc sys dev tmp run workspace mnt; do /bin/busybox mkdir -p /mnt/$d; done
	/bin/busybox touch /mnt/.stage2
	exec /bin/busybox switch_root /mnt /init
fi
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmp /tmp
mount -t tmpfs -o mode=0755 run /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
echo "+memory +pids +cpu" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
for m in @MODULES@; do insmod $m || echo "atrium-init: insmod $m failed"; done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
[ -e /sys/block/vdb ] || sleep 0.2
# The workspace disk, and the tools disk (node and the agents, read-only)
# when the image has one: told apart by the tools disk's label.
for d in /dev/vda /dev/vdb; do
	[ -b $d ] || continue
	if [ "$(dd if=$d bs=1 skip=1144 count=12 2>/dev/null)" = @TOOLSLABEL@ ]; then
		mkdir -p @TOOLSPATH@
		mount -t ext4 -o ro $d @TOOLSPATH@ || echo "atrium-init: cannot mount the tools disk"
		mkdir -p /usr/local/bin && ln -sf @TOOLSPATH@/bin/node /usr/local/bin/node
	else
		mount -t ext4 $d /var/lib/atrium-agent || echo "atrium-init: cannot mount the workspace disk"
	fi
done
hostname sandbox
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
# The VM's configuration (token, time, randomness) comes from the VM host
# over a port it forwards from its loopback only, after boot or after a
# clone's restore from a snapshot taken here: never on a command line.
echo "atrium-init: waiting for the configuration"
while :; do
	nc -l -p 7071 </dev/null >/run/config 2>/dev/null
	[ "$(head -n 1 /run/config)" = ATRIUMCFG1 ] && break
done
umask 077
sed -n 2p /run/config >/run/token
umask 022
date -u -s "@$(sed -n 3p /run/config)" >/dev/null
sed -n 4p /run/config >/dev/urandom
rm -f /run/config
# Later messages on the same port set the clock (and stir the pool): the
# VM host sends one after a wake from sleep.
(
	while :; do
		nc -l -p 7071 </dev/null >/run/clock 2>/dev/null
		if [ "$(head -n 1 /run/clock)" = ATRIUMTIME ]; then
			date -u -s "@$(sed -n 2p /run/clock)" >/dev/null
			sed -n 3p /run/clock >/dev/urandom
		fi
	done
) </dev/null >/dev/null 2>&1 &
echo "atrium-init: starting the agent"
while :; do
	atrium sandbox-agent --listen 0.0.0.0:7070 --token-file /run/token --dir /var/lib/atrium-agent \
		--upstream-proxy @PROXY@ </dev/null
	echo "atrium-init: the agent exited ($?); restarting"
	sleep 1
done
`
