package fakedp

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mknod needs root")
	}
}

func TestEnsureNode(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "dri", "renderD128")
	old := unix.Umask(0o077)
	defer unix.Umask(old)
	for i := 0; i < 2; i++ { // idempotent
		if err := EnsureNode(p); err != nil {
			t.Fatal(err)
		}
		ok, err := IsFakeNode(p)
		if err != nil || !ok {
			t.Fatalf("pass %d: %s is not a 1:3 char device (%v)", i, p, err)
		}
		fi, _ := os.Stat(p)
		if fi.Mode().Perm() != 0o666 {
			t.Errorf("mode %v", fi.Mode())
		}
	}
	// A stale regular file is replaced.
	f := filepath.Join(dir, "kfd")
	if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := EnsureNode(f); err != nil {
		t.Fatal(err)
	}
	if ok, _ := IsFakeNode(f); !ok {
		t.Error("regular file not replaced")
	}
	// A node with other numbers is replaced.
	z := filepath.Join(dir, "zero")
	if err := unix.Mknod(z, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 5))); err != nil {
		t.Fatal(err)
	}
	if err := EnsureNode(z); err != nil {
		t.Fatal(err)
	}
	if ok, _ := IsFakeNode(z); !ok {
		t.Error("1:5 node not replaced")
	}
	// A directory is an error, not removed.
	if err := EnsureNode(filepath.Join(dir, "dri")); err == nil {
		t.Error("directory accepted")
	}
}

func TestEnsureNodesForPlan(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	rs, err := Plan([]ResourceSpec{{"amd.com/gpu", 2}, {"rdma/hca", 2}}, dir)
	if err != nil {
		t.Fatal(err)
	}
	n, err := EnsureNodes(rs)
	if err != nil {
		t.Fatal(err)
	}
	if n != 5+7 {
		t.Errorf("%d nodes, want 12", n)
	}
	for _, rel := range []string{"kfd", "dri/card1", "dri/renderD129", "infiniband/uverbs1", "infiniband/umad0", "infiniband/issm1", "infiniband/rdma_cm"} {
		if ok, err := IsFakeNode(filepath.Join(dir, rel)); !ok {
			t.Errorf("%s: not a fake node (%v)", rel, err)
		}
	}
}
