package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/infera/testenv/device-plugin/internal/fakedp"
)

// TestMain lets a test run this binary's main() in a child process (the test
// binary re-executed with INFERA_DP_TEST_MAIN=1), to test signals and exit
// codes without a separate go build.
func TestMain(m *testing.M) {
	if os.Getenv("INFERA_DP_TEST_MAIN") == "1" {
		args := strings.Split(os.Getenv("INFERA_DP_TEST_ARGS"), "\x1f")
		os.Exit(run(args, os.Stderr))
	}
	os.Exit(m.Run())
}

func TestParseArgs(t *testing.T) {
	cfg, err := parseArgs([]string{
		"--resource", "amd.com/gpu=8", "--resource=rdma/hca=8", "-resource", "rdma/ainic=4",
		"--device-dir", "/x/dev", "--plugin-dir", "/x/dp", "--poll-interval", "250ms",
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := []fakedp.ResourceSpec{{Name: "amd.com/gpu", Count: 8}, {Name: "rdma/hca", Count: 8}, {Name: "rdma/ainic", Count: 4}}
	if len(cfg.Resources) != 3 || cfg.Resources[0] != want[0] || cfg.Resources[1] != want[1] || cfg.Resources[2] != want[2] {
		t.Errorf("resources %v", cfg.Resources)
	}
	if cfg.DeviceDir != "/x/dev" || cfg.PluginDir != "/x/dp" || cfg.PollInterval != 250*time.Millisecond {
		t.Errorf("cfg %+v", cfg)
	}

	cfg, err = parseArgs([]string{"--resource", "rdma/hca=1"}, io.Discard)
	if err != nil || cfg.DeviceDir != "/var/lib/infera-cluster/devices" || cfg.PluginDir != "/var/lib/kubelet/device-plugins" {
		t.Errorf("defaults %+v %v", cfg, err)
	}

	for _, bad := range [][]string{
		{},
		{"--resource", "gpu=1"},
		{"--resource", "amd.com/gpu=0"},
		{"--resource", "amd.com/gpu"},
		{"--resource", "rdma/hca=1", "extra"},
		{"--nope"},
	} {
		if _, err := parseArgs(bad, io.Discard); err == nil {
			t.Errorf("parseArgs(%q) accepted", bad)
		}
	}
}

func TestHelp(t *testing.T) {
	var out bytes.Buffer
	_, err := parseArgs([]string{"--help"}, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err %v", err)
	}
	for _, s := range []string{"--resource", "-device-dir", "-plugin-dir", "amd.com/gpu", "/dev/kfd", "uverbs", "kubelet.sock", "SIGTERM"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("--help does not mention %q", s)
		}
	}
	if code := run([]string{"--help"}, io.Discard); code != 0 {
		t.Errorf("--help exits %d", code)
	}
	if code := run([]string{"--resource", "bad"}, io.Discard); code != 2 {
		t.Errorf("a bad flag exits %d, want 2", code)
	}
}

// registrar is a minimal kubelet Registration service.
type registrar struct {
	pluginapi.UnimplementedRegistrationServer
	got chan *pluginapi.RegisterRequest
}

func (r *registrar) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	r.got <- req
	return &pluginapi.Empty{}, nil
}

// TestProcessSIGTERM runs main() in a child process against a fake kubelet,
// waits for its registration, sends SIGTERM and checks a clean exit that
// removed the plugin's socket.
func TestProcessSIGTERM(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the process creates device nodes, which needs root")
	}
	pluginDir, err := os.MkdirTemp("", "dpm")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(pluginDir)
	deviceDir := t.TempDir()

	ln, err := net.Listen("unix", filepath.Join(pluginDir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	reg := &registrar{got: make(chan *pluginapi.RegisterRequest, 4)}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, reg)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), "INFERA_DP_TEST_MAIN=1", "INFERA_DP_TEST_ARGS="+strings.Join([]string{
		"--resource", "rdma/hca=2", "--device-dir", deviceDir, "--plugin-dir", pluginDir, "--poll-interval", "100ms",
	}, "\x1f"))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()

	select {
	case req := <-reg.got:
		if req.ResourceName != "rdma/hca" || req.Endpoint != "infera-rdma_hca.sock" {
			t.Errorf("registration %+v", req)
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("no registration from the child process")
	}
	sock := filepath.Join(pluginDir, "infera-rdma_hca.sock")
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("plugin socket: %v", err)
	}
	if ok, err := fakedp.IsFakeNode(filepath.Join(deviceDir, "infiniband", "uverbs1")); !ok {
		t.Errorf("uverbs1 node: %v", err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var log []string
	for l := range lines {
		log = append(log, l)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v\n%s", err, strings.Join(log, "\n"))
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("child did not exit after SIGTERM")
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind: %v", err)
	}
	joined := strings.Join(log, "\n")
	t.Logf("child log:\n%s", joined)
	if !strings.Contains(joined, "registered rdma/hca") {
		t.Errorf("no registration log line:\n%s", joined)
	}
}
