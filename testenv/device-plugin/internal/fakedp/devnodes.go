package fakedp

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// The host side of every fake device node is a character device with the
// numbers of /dev/null, so a container that opens /dev/kfd or
// /dev/infiniband/uverbs0 gets a harmless null device.
const (
	nullMajor = 1
	nullMinor = 3
	// nodeMode lets a container running as any user open the node, as
	// /dev/null and the real /dev/infiniband/uverbs* allow.
	nodeMode = 0o666
)

// IsFakeNode reports whether path is a character device 1:3.
func IsFakeNode(path string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return false, err
	}
	return st.Mode&unix.S_IFMT == unix.S_IFCHR &&
		unix.Major(uint64(st.Rdev)) == nullMajor && unix.Minor(uint64(st.Rdev)) == nullMinor, nil
}

// EnsureNode makes path a character device 1:3 with mode 0666, creating parent
// folders. It is idempotent: a node that is already right is left alone; any
// other non-directory at path (a stale file, a node with other numbers) is
// replaced. It needs CAP_MKNOD (root).
func EnsureNode(path string) error {
	ok, err := IsFakeNode(path)
	switch {
	case err == nil && ok:
		return os.Chmod(path, nodeMode)
	case err == nil:
		fi, lerr := os.Lstat(path)
		if lerr == nil && fi.IsDir() {
			return fmt.Errorf("%s is a directory, want a character device", path)
		}
		if rerr := os.Remove(path); rerr != nil {
			return rerr
		}
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := unix.Mknod(path, unix.S_IFCHR|nodeMode, int(unix.Mkdev(nullMajor, nullMinor))); err != nil {
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("mknod %s: %w (creating device nodes needs root / CAP_MKNOD)", path, err)
		}
		return fmt.Errorf("mknod %s: %w", path, err)
	}
	// mknod's mode is filtered by the umask.
	return os.Chmod(path, nodeMode)
}

// EnsureNodes creates every host node of the given resources.
func EnsureNodes(resources []*Resource) (int, error) {
	n := 0
	seen := map[string]bool{}
	for _, r := range resources {
		for _, p := range r.HostNodes() {
			if seen[p] {
				continue
			}
			seen[p] = true
			if err := EnsureNode(p); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}
