package fakedp

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func TestParseResourceSpec(t *testing.T) {
	good := map[string]ResourceSpec{
		"amd.com/gpu=8":        {"amd.com/gpu", 8},
		"rdma/hca=8":           {"rdma/hca", 8},
		" rdma/ainic = 4 ":     {"rdma/ainic", 4},
		"example.com/ai-nic=1": {"example.com/ai-nic", 1},
	}
	for in, want := range good {
		got, err := ParseResourceSpec(in)
		if err != nil || got != want {
			t.Errorf("ParseResourceSpec(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{
		"amd.com/gpu", "amd.com/gpu=0", "amd.com/gpu=-1", "amd.com/gpu=x", "gpu=1",
		"kubernetes.io/gpu=1", "a/b/c=1", "Rdma/hca=1", "rdma/=1", "amd.com/gpu=129",
	} {
		if _, err := ParseResourceSpec(in); err == nil {
			t.Errorf("ParseResourceSpec(%q) accepted", in)
		}
	}
}

func TestKindOf(t *testing.T) {
	if KindOf("amd.com/gpu") != KindGPU {
		t.Error("amd.com/gpu is not a GPU")
	}
	for _, n := range []string{"rdma/hca", "rdma/ainic", "amd.com/ainic", "example.com/gpu"} {
		if KindOf(n) != KindRDMA {
			t.Errorf("%s is not RDMA", n)
		}
	}
}

func mustPlan(t *testing.T, dir string, specs ...ResourceSpec) map[string]*Resource {
	t.Helper()
	rs, err := Plan(specs, dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*Resource{}
	for _, r := range rs {
		out[r.Name] = r
	}
	return out
}

func TestPlanIDsAndErrors(t *testing.T) {
	rs := mustPlan(t, "/d", ResourceSpec{"amd.com/gpu", 8}, ResourceSpec{"rdma/hca", 8}, ResourceSpec{"rdma/ainic", 4})
	if got := strings.Join(rs["amd.com/gpu"].IDs(), ","); got != "gpu0,gpu1,gpu2,gpu3,gpu4,gpu5,gpu6,gpu7" {
		t.Errorf("gpu IDs %s", got)
	}
	if got := strings.Join(rs["rdma/ainic"].IDs(), ","); got != "ainic0,ainic1,ainic2,ainic3" {
		t.Errorf("ainic IDs %s", got)
	}
	// RDMA devices are numbered across RDMA resources, in flag order.
	if d := rs["rdma/ainic"].byID["ainic0"]; d.Index != 8 {
		t.Errorf("ainic0 index %d, want 8 (after hca0..hca7)", d.Index)
	}
	for _, d := range rs["amd.com/gpu"].ListDevices() {
		if d.Health != pluginapi.Healthy {
			t.Errorf("%s is %s", d.ID, d.Health)
		}
	}
	if _, err := Plan([]ResourceSpec{{"rdma/hca", 1}, {"rdma/hca", 2}}, "/d"); err == nil {
		t.Error("duplicate resource accepted")
	}
	if _, err := Plan([]ResourceSpec{{"rdma/hca", 1}}, "relative"); err == nil {
		t.Error("relative device dir accepted")
	}
	if _, err := Plan(nil, "/d"); err == nil {
		t.Error("no resources accepted")
	}
	hn := rs["amd.com/gpu"].HostNodes()
	if len(hn) != 1+2*8 || hn[0] != "/d/kfd" {
		t.Errorf("gpu host nodes %v", hn)
	}
	hn = rs["rdma/hca"].HostNodes()
	if len(hn) != 1+3*8 {
		t.Errorf("hca host nodes %d: %v", len(hn), hn)
	}
}

func specs(ds []*pluginapi.DeviceSpec) [][3]string {
	out := make([][3]string, len(ds))
	for i, d := range ds {
		out[i] = [3]string{d.ContainerPath, d.HostPath, d.Permissions}
	}
	return out
}

func TestAllocateGPU(t *testing.T) {
	r := mustPlan(t, "/dev-test", ResourceSpec{"amd.com/gpu", 8})["amd.com/gpu"]
	// Out of order on purpose: the response is in GPU order.
	car, err := r.Allocate([]string{"gpu3", "gpu1"})
	if err != nil {
		t.Fatal(err)
	}
	want := [][3]string{
		{"/dev/kfd", "/dev-test/kfd", "rw"},
		{"/dev/dri/card1", "/dev-test/dri/card1", "rw"},
		{"/dev/dri/renderD129", "/dev-test/dri/renderD129", "rw"},
		{"/dev/dri/card3", "/dev-test/dri/card3", "rw"},
		{"/dev/dri/renderD131", "/dev-test/dri/renderD131", "rw"},
	}
	if got := specs(car.Devices); !reflect.DeepEqual(got, want) {
		t.Errorf("devices\n got %v\nwant %v", got, want)
	}
	if len(car.Envs) != 0 || len(car.Mounts) != 0 || len(car.Annotations) != 0 || len(car.CDIDevices) != 0 {
		t.Errorf("GPU response has extras: %+v", car)
	}
	if _, err := r.Allocate([]string{"gpu8"}); err == nil {
		t.Error("unknown device accepted")
	}
	if !r.Options().GetPreferredAllocationAvailable || r.Options().PreStartRequired {
		t.Errorf("GPU options %+v", r.Options())
	}
}

func TestAllocateRDMA(t *testing.T) {
	rs := mustPlan(t, "/dt", ResourceSpec{"rdma/hca", 8}, ResourceSpec{"rdma/ainic", 4})
	car, err := rs["rdma/hca"].Allocate([]string{"hca2", "hca0"})
	if err != nil {
		t.Fatal(err)
	}
	want := [][3]string{
		{"/dev/infiniband/issm0", "/dt/infiniband/issm0", "rw"},
		{"/dev/infiniband/umad0", "/dt/infiniband/umad0", "rw"},
		{"/dev/infiniband/uverbs0", "/dt/infiniband/uverbs0", "rw"},
		{"/dev/infiniband/rdma_cm", "/dt/infiniband/rdma_cm", "rw"},
		{"/dev/infiniband/issm2", "/dt/infiniband/issm2", "rw"},
		{"/dev/infiniband/umad2", "/dt/infiniband/umad2", "rw"},
		{"/dev/infiniband/uverbs2", "/dt/infiniband/uverbs2", "rw"},
	}
	if got := specs(car.Devices); !reflect.DeepEqual(got, want) {
		t.Errorf("devices\n got %v\nwant %v", got, want)
	}
	if len(car.Mounts) != 0 || len(car.Annotations) != 0 {
		t.Errorf("RDMA response has mounts/annotations: %+v", car)
	}
	if got := car.Envs["PCIDEVICE_RDMA_HCA"]; got != "hca0,hca2" {
		t.Errorf("PCIDEVICE_RDMA_HCA = %q", got)
	}
	var info map[string]map[string]map[string]string
	if err := json.Unmarshal([]byte(car.Envs["PCIDEVICE_RDMA_HCA_INFO"]), &info); err != nil {
		t.Fatalf("PCIDEVICE_RDMA_HCA_INFO: %v", err)
	}
	wantInfo := map[string]map[string]string{
		"generic": {"deviceID": "hca2"},
		"rdma": {
			"issm": "/dev/infiniband/issm2", "umad": "/dev/infiniband/umad2",
			"uverbs": "/dev/infiniband/uverbs2", "rdma_cm": "/dev/infiniband/rdma_cm", "rdma_dev": "hca2",
		},
	}
	if len(info) != 2 || !reflect.DeepEqual(info["hca2"], wantInfo) {
		t.Errorf("INFO = %v", info)
	}
	if len(car.Envs) != 2 {
		t.Errorf("envs %v", car.Envs)
	}

	// The second RDMA resource continues the node-wide numbering.
	car, err = rs["rdma/ainic"].Allocate([]string{"ainic1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := car.Devices[2].ContainerPath; got != "/dev/infiniband/uverbs9" {
		t.Errorf("ainic1 uverbs = %s, want uverbs9", got)
	}
	if got := car.Envs["PCIDEVICE_RDMA_AINIC"]; got != "ainic1" {
		t.Errorf("PCIDEVICE_RDMA_AINIC = %q", got)
	}
	if o := rs["rdma/hca"].Options(); o.GetPreferredAllocationAvailable || o.PreStartRequired {
		t.Errorf("RDMA options %+v", o)
	}
}

func TestSRIOVEnvName(t *testing.T) {
	for in, want := range map[string]string{
		"rdma/hca":                        "PCIDEVICE_RDMA_HCA",
		"intel.com/intel_sriov_netdevice": "PCIDEVICE_INTEL_COM_INTEL_SRIOV_NETDEVICE",
		"example.com/ai-nic":              "PCIDEVICE_EXAMPLE_COM_AI_NIC",
	} {
		if got := SRIOVEnvName(in); got != want {
			t.Errorf("SRIOVEnvName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPreferred(t *testing.T) {
	r := mustPlan(t, "/d", ResourceSpec{"amd.com/gpu", 12})["amd.com/gpu"]
	got, err := r.Preferred([]string{"gpu11", "gpu10", "gpu2", "gpu5", "gpu3"}, []string{"gpu5"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"gpu5", "gpu2", "gpu3"}; !reflect.DeepEqual(got, want) {
		t.Errorf("preferred %v, want %v", got, want)
	}
	if _, err := r.Preferred([]string{"gpu1"}, nil, 2); err == nil {
		t.Error("over-allocation accepted")
	}
}
