package fakedp

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fakeKubelet is a small stand-in for the kubelet's Registration service. Like
// the real one (pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go), it
// dials the plugin's endpoint back during Register and asks for its options,
// so a Register only succeeds if the plugin is already serving.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	dir  string
	srv  *grpc.Server
	regs chan registration
}

type registration struct {
	req     *pluginapi.RegisterRequest
	options *pluginapi.DevicePluginOptions
}

func startFakeKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	sock := filepath.Join(dir, "kubelet.sock")
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{dir: dir, srv: grpc.NewServer(), regs: make(chan registration, 16)}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(ln) }()
	t.Cleanup(k.srv.Stop)
	return k
}

func (k *fakeKubelet) Register(ctx context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if r.Version != pluginapi.Version {
		return nil, errors.New("bad version " + r.Version)
	}
	conn, err := dialPlugin(filepath.Join(k.dir, r.Endpoint))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	opts, err := pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil {
		return nil, err
	}
	k.regs <- registration{req: r, options: opts}
	return &pluginapi.Empty{}, nil
}

func dialPlugin(path string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// shortTempDir keeps socket paths under the 108-byte limit for unix sockets.
func shortTempDir(t *testing.T, pattern string) string {
	t.Helper()
	d, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// waitRegs collects n registrations (in any order), keyed by resource name.
func waitRegs(t *testing.T, k *fakeKubelet, n int) map[string]registration {
	t.Helper()
	out := map[string]registration{}
	deadline := time.After(10 * time.Second)
	for len(out) < n {
		select {
		case r := <-k.regs:
			out[r.req.ResourceName] = r
		case <-deadline:
			t.Fatalf("got %d of %d registrations", len(out), n)
		}
	}
	return out
}

func startManager(t *testing.T, pluginDir, deviceDir string, specs ...ResourceSpec) *Manager {
	t.Helper()
	m, err := New(Config{
		Resources:       specs,
		DeviceDir:       deviceDir,
		PluginDir:       pluginDir,
		PollInterval:    50 * time.Millisecond,
		SkipDeviceNodes: os.Geteuid() != 0,
		Log:             testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	return m
}

func TestRegisterListAndWatchAllocate(t *testing.T) {
	pluginDir := shortTempDir(t, "dp")
	deviceDir := shortTempDir(t, "dev")
	k := startFakeKubelet(t, pluginDir)
	m := startManager(t, pluginDir, deviceDir,
		ResourceSpec{"amd.com/gpu", 8}, ResourceSpec{"rdma/hca", 8}, ResourceSpec{"rdma/ainic", 4})

	regs := waitRegs(t, k, 3)
	for name, wantEndpoint := range map[string]string{
		"amd.com/gpu": "infera-amd.com_gpu.sock",
		"rdma/hca":    "infera-rdma_hca.sock",
		"rdma/ainic":  "infera-rdma_ainic.sock",
	} {
		r, ok := regs[name]
		if !ok {
			t.Fatalf("%s not registered", name)
		}
		if r.req.Endpoint != wantEndpoint || r.req.Version != "v1beta1" {
			t.Errorf("%s: endpoint %q version %q", name, r.req.Endpoint, r.req.Version)
		}
		if _, err := os.Stat(filepath.Join(pluginDir, wantEndpoint)); err != nil {
			t.Errorf("%s: socket: %v", name, err)
		}
	}
	if !regs["amd.com/gpu"].options.GetPreferredAllocationAvailable || regs["rdma/hca"].options.GetPreferredAllocationAvailable {
		t.Errorf("options: gpu %+v hca %+v", regs["amd.com/gpu"].options, regs["rdma/hca"].options)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// GPU: ListAndWatch, GetPreferredAllocation, Allocate.
	conn, err := dialPlugin(m.SocketPath("amd.com/gpu"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	gpu := pluginapi.NewDevicePluginClient(conn)
	stream, err := gpu.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	lw, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range lw.Devices {
		if d.Health != pluginapi.Healthy {
			t.Errorf("%s: %s", d.ID, d.Health)
		}
		ids = append(ids, d.ID)
	}
	if strings.Join(ids, ",") != "gpu0,gpu1,gpu2,gpu3,gpu4,gpu5,gpu6,gpu7" {
		t.Errorf("ListAndWatch devices %v", ids)
	}
	pref, err := gpu.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: []string{"gpu7", "gpu4", "gpu6"}, AllocationSize: 2,
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := pref.ContainerResponses[0].DeviceIDs; !reflect.DeepEqual(got, []string{"gpu4", "gpu6"}) {
		t.Errorf("preferred %v", got)
	}
	ar, err := gpu.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIDs: []string{"gpu0"}}, {DevicesIDs: []string{"gpu6", "gpu7"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(ar.ContainerResponses) != 2 {
		t.Fatalf("%d container responses", len(ar.ContainerResponses))
	}
	want := [][3]string{
		{"/dev/kfd", deviceDir + "/kfd", "rw"},
		{"/dev/dri/card6", deviceDir + "/dri/card6", "rw"},
		{"/dev/dri/renderD134", deviceDir + "/dri/renderD134", "rw"},
		{"/dev/dri/card7", deviceDir + "/dri/card7", "rw"},
		{"/dev/dri/renderD135", deviceDir + "/dri/renderD135", "rw"},
	}
	if got := specs(ar.ContainerResponses[1].Devices); !reflect.DeepEqual(got, want) {
		t.Errorf("GPU allocate\n got %v\nwant %v", got, want)
	}
	if len(ar.ContainerResponses[1].Envs) != 0 {
		t.Errorf("GPU envs %v", ar.ContainerResponses[1].Envs)
	}
	if _, err := gpu.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIDs: []string{"gpu9"}},
	}}); err == nil {
		t.Error("Allocate of an unknown device succeeded")
	}
	if _, err := gpu.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIDs: []string{"gpu0"}}); err != nil {
		t.Error(err)
	}
	checkHostNodes(t, deviceDir, ar.ContainerResponses[1].Devices)

	// RDMA (the second RDMA resource, to see node-wide numbering over gRPC).
	conn2, err := dialPlugin(m.SocketPath("rdma/ainic"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	nic := pluginapi.NewDevicePluginClient(conn2)
	stream2, err := nic.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	lw, err = stream2.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(lw.Devices) != 4 || lw.Devices[3].ID != "ainic3" {
		t.Errorf("ainic devices %v", lw.Devices)
	}
	ar, err = nic.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIDs: []string{"ainic0"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	want = [][3]string{
		{"/dev/infiniband/issm8", deviceDir + "/infiniband/issm8", "rw"},
		{"/dev/infiniband/umad8", deviceDir + "/infiniband/umad8", "rw"},
		{"/dev/infiniband/uverbs8", deviceDir + "/infiniband/uverbs8", "rw"},
		{"/dev/infiniband/rdma_cm", deviceDir + "/infiniband/rdma_cm", "rw"},
	}
	car := ar.ContainerResponses[0]
	if got := specs(car.Devices); !reflect.DeepEqual(got, want) {
		t.Errorf("RDMA allocate\n got %v\nwant %v", got, want)
	}
	if car.Envs["PCIDEVICE_RDMA_AINIC"] != "ainic0" || !strings.Contains(car.Envs["PCIDEVICE_RDMA_AINIC_INFO"], `"uverbs":"/dev/infiniband/uverbs8"`) {
		t.Errorf("RDMA envs %v", car.Envs)
	}
	checkHostNodes(t, deviceDir, car.Devices)
}

// checkHostNodes: every host path is under the device dir and, when the test
// could mknod (root), a 1:3 character device.
func checkHostNodes(t *testing.T, deviceDir string, devs []*pluginapi.DeviceSpec) {
	t.Helper()
	for _, d := range devs {
		if !strings.HasPrefix(d.HostPath, deviceDir+"/") {
			t.Errorf("host path %s is not under %s", d.HostPath, deviceDir)
		}
		if os.Geteuid() != 0 {
			continue
		}
		if ok, err := IsFakeNode(d.HostPath); !ok {
			t.Errorf("%s is not a 1:3 character device (%v)", d.HostPath, err)
		}
	}
}

func TestReRegistersAfterKubeletRestart(t *testing.T) {
	pluginDir := shortTempDir(t, "dp")
	k := startFakeKubelet(t, pluginDir)
	m := startManager(t, pluginDir, shortTempDir(t, "dev"), ResourceSpec{"amd.com/gpu", 2}, ResourceSpec{"rdma/hca", 2})
	waitRegs(t, k, 2)

	// A kubelet restart: the old kubelet goes away, the new one removes
	// every socket in its folder, then listens on a new kubelet.sock.
	k.srv.Stop()
	time.Sleep(150 * time.Millisecond) // the plugin notices kubelet.sock is gone
	for _, name := range []string{"amd.com/gpu", "rdma/hca"} {
		if err := os.Remove(m.SocketPath(name)); err != nil {
			t.Fatal(err)
		}
	}
	k2 := startFakeKubelet(t, pluginDir)
	regs := waitRegs(t, k2, 2)
	if regs["rdma/hca"].req.Endpoint != "infera-rdma_hca.sock" {
		t.Errorf("re-registration %+v", regs["rdma/hca"].req)
	}
	for _, name := range []string{"amd.com/gpu", "rdma/hca"} {
		if _, err := os.Stat(m.SocketPath(name)); err != nil {
			t.Errorf("%s socket not re-created: %v", name, err)
		}
	}

	// A restart fast enough that only kubelet.sock is seen to change.
	k2.srv.Stop()
	k3 := startFakeKubelet(t, pluginDir)
	waitRegs(t, k3, 2)

	// No spurious re-registration while nothing changes.
	select {
	case r := <-k3.regs:
		t.Errorf("unexpected registration %v", r.req)
	case <-time.After(300 * time.Millisecond):
	}
}

func TestWaitsForKubeletAndStopRemovesSockets(t *testing.T) {
	pluginDir := shortTempDir(t, "dp")
	// A stale socket from an earlier run is replaced.
	stale := filepath.Join(pluginDir, SocketName("rdma/hca"))
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	m := startManager(t, pluginDir, shortTempDir(t, "dev"), ResourceSpec{"rdma/hca", 1})
	time.Sleep(150 * time.Millisecond) // several polls with no kubelet
	k := startFakeKubelet(t, pluginDir)
	waitRegs(t, k, 1)

	m.Stop()
	if _, err := os.Stat(m.SocketPath("rdma/hca")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket still there after Stop: %v", err)
	}
	if _, err := os.Stat(filepath.Join(pluginDir, "kubelet.sock")); err != nil {
		t.Errorf("Stop touched kubelet.sock: %v", err)
	}
}
