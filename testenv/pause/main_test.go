package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func buildPause(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func TestVersion(t *testing.T) {
	out, err := exec.Command(buildPause(t), "-v").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(out), "pause.go v"+version) {
		t.Fatalf("-v printed %q", out)
	}
}

func TestExitsZeroOnSignal(t *testing.T) {
	bin := buildPause(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		var stderr bytes.Buffer
		cmd := exec.Command(bin)
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Give it time to install its handlers (a signal before
		// signal.Notify would kill it the default way).
		time.Sleep(200 * time.Millisecond)
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("%v: %v (stderr %q)", sig, err, stderr.String())
		}
		if !strings.Contains(stderr.String(), "Shutting down") {
			t.Fatalf("%v: stderr %q", sig, stderr.String())
		}
	}
}

// TestReapsOrphansAsPID1 runs pause as PID 1 of a new PID namespace, has a
// shell inside that namespace orphan a short-lived child (which the kernel
// reparents to pause), and checks that the child does not stay a zombie.
func TestReapsOrphansAsPID1(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a new PID namespace")
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		t.Skip("needs nsenter")
	}
	cmd := exec.Command(buildPause(t))
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot create a PID namespace here: %v", err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	time.Sleep(200 * time.Millisecond)

	// The shell starts `sleep` in the background and exits at once; `sleep`
	// is then an orphan that the kernel reparents to pause, PID 1 of the
	// namespace. When it exits, only pause can reap it.
	if out, err := exec.Command(nsenter, "-t", strconv.Itoa(cmd.Process.Pid), "-p",
		"sh", "-c", "sleep 1 >/dev/null 2>&1 & exit 0").CombinedOutput(); err != nil {
		t.Fatalf("nsenter: %v\n%s", err, out)
	}
	if len(children(t, cmd.Process.Pid)) == 0 {
		t.Fatal("the orphan did not become a child of pause")
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if len(children(t, cmd.Process.Pid)) == 0 {
			return // reaped
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("pause left children behind: %v", children(t, cmd.Process.Pid))
}

// children lists "pid state" for each process whose parent is parent.
func children(t *testing.T, parent int) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces, so split after ')'.
		s := string(stat)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) >= 2 && f[1] == strconv.Itoa(parent) {
			found = append(found, e.Name()+" "+f[0])
		}
	}
	return found
}
