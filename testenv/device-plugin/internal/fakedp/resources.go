// Package fakedp is a fake Kubernetes device plugin for Infera's one-node test
// cluster. It speaks the kubelet's real device-plugin API (v1beta1), so the
// kubelet does its own scheduling and allocation accounting, but every device
// node it hands out is a character device 1:3 (the same as /dev/null) that it
// created itself under a test folder.
//
// Two kinds of resource are emulated, recognised by name:
//
//   - amd.com/gpu: shaped like the AMD GPU device plugin
//     (github.com/ROCm/k8s-device-plugin, internal/pkg/plugin/plugin.go).
//   - any other name (rdma/hca, rdma/ainic, ...): shaped like an RDMA device
//     plugin for RoCE/AINIC NICs, following the SR-IOV network device plugin
//     (github.com/k8snetworkplumbingwg/sriov-network-device-plugin,
//     pkg/devices/rdma.go, pkg/infoprovider/rdmaInfoProvider.go,
//     pkg/resources/pool_stub.go) for per-device allocation and environment,
//     and the character-device list of github.com/Mellanox/rdmamap
//     (rdma_map.go, GetRdmaCharDevices), which both that plugin and
//     github.com/Mellanox/k8s-rdma-shared-dev-plugin (pkg/resources/server.go,
//     pkg/resources/rdma_device_spec.go) use.
package fakedp

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// AMDGPUResource is the one resource name that gets the GPU behaviour.
const AMDGPUResource = "amd.com/gpu"

// Kind is the behaviour a resource gets.
type Kind int

const (
	// KindGPU behaves like ROCm/k8s-device-plugin.
	KindGPU Kind = iota
	// KindRDMA behaves like an RDMA NIC device plugin.
	KindRDMA
)

func (k Kind) String() string {
	if k == KindGPU {
		return "gpu"
	}
	return "rdma"
}

// KindOf tells which behaviour a resource name gets.
func KindOf(resourceName string) Kind {
	if resourceName == AMDGPUResource {
		return KindGPU
	}
	return KindRDMA
}

const (
	// maxGPUs keeps renderD<128+N> inside the DRM render-node minor range
	// (128..255).
	maxGPUs = 128
	// maxRDMA is an arbitrary sanity bound on one RDMA resource.
	maxRDMA = 1024

	// Permissions given to the container for every device node.
	// GPU: ROCm/k8s-device-plugin sets "rw" on /dev/kfd and /dev/dri/*.
	// RDMA: the SR-IOV network device plugin sets "rw" (pkg/devices/rdma.go);
	// k8s-rdma-shared-dev-plugin sets "rwm". We follow SR-IOV, whose
	// per-device allocation we also follow.
	gpuPermissions  = "rw"
	rdmaPermissions = "rw"
)

// ResourceSpec is one --resource NAME=COUNT flag.
type ResourceSpec struct {
	Name  string
	Count int
}

func (s ResourceSpec) String() string { return fmt.Sprintf("%s=%d", s.Name, s.Count) }

var (
	dnsLabel      = `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
	dnsSubdomain  = regexp.MustCompile(`^` + dnsLabel + `(\.` + dnsLabel + `)*$`)
	qualifiedName = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
)

// ValidateResourceName checks the rules the kubelet applies to a device
// plugin's resource name (an extended resource: "domain/name", the domain not
// kubernetes.io or a subdomain of it, nor requests.*), so that a bad name fails
// at start instead of at registration.
func ValidateResourceName(name string) error {
	domain, short, ok := strings.Cut(name, "/")
	if !ok || strings.Contains(short, "/") {
		return fmt.Errorf("resource name %q must have the form DOMAIN/NAME, e.g. rdma/hca", name)
	}
	if len(domain) > 253 || !dnsSubdomain.MatchString(domain) {
		return fmt.Errorf("resource name %q: %q is not a DNS subdomain", name, domain)
	}
	if domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") {
		return fmt.Errorf("resource name %q: the kubernetes.io domain is reserved", name)
	}
	if strings.HasPrefix(name, "requests.") {
		return fmt.Errorf("resource name %q: the requests. prefix is reserved", name)
	}
	if len(short) > 63 || !qualifiedName.MatchString(short) {
		return fmt.Errorf("resource name %q: %q is not a valid name (alphanumerics, '-', '_', '.'; at most 63)", name, short)
	}
	return nil
}

// ParseResourceSpec parses NAME=COUNT.
func ParseResourceSpec(s string) (ResourceSpec, error) {
	name, count, ok := strings.Cut(s, "=")
	if !ok {
		return ResourceSpec{}, fmt.Errorf("--resource %q: want NAME=COUNT, e.g. amd.com/gpu=8", s)
	}
	name = strings.TrimSpace(name)
	if err := ValidateResourceName(name); err != nil {
		return ResourceSpec{}, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(count))
	if err != nil || n < 1 {
		return ResourceSpec{}, fmt.Errorf("--resource %q: COUNT must be a whole number >= 1", s)
	}
	limit := maxRDMA
	if KindOf(name) == KindGPU {
		limit = maxGPUs
	}
	if n > limit {
		return ResourceSpec{}, fmt.Errorf("--resource %q: at most %d devices for this kind", s, limit)
	}
	return ResourceSpec{Name: name, Count: n}, nil
}

// Node is one device node: where the container sees it and the character
// device under --device-dir that backs it.
type Node struct {
	ContainerPath string
	HostPath      string
	// EnvKey names the node in the SR-IOV _INFO environment ("uverbs",
	// "umad", "issm", "rdma_cm"); empty for GPU nodes.
	EnvKey string
}

// Device is one advertised device of a resource.
type Device struct {
	ID    string
	Index int // GPU number (cardN), or the node-wide RDMA device number (uverbsN)
	// Nodes lists the nodes Allocate hands out for this device, in order.
	// Nodes shared by every device (/dev/kfd, /dev/infiniband/rdma_cm) are
	// included; Allocate de-duplicates them by host path.
	Nodes []Node
}

// Resource is one planned resource: its devices and their nodes.
type Resource struct {
	Name    string
	Kind    Kind
	Devices []*Device
	byID    map[string]*Device
}

// hostPathFor maps a container path under /dev to the same relative path
// under the device dir: /dev/dri/card0 -> DIR/dri/card0.
func hostPathFor(deviceDir, containerPath string) string {
	return filepath.Join(deviceDir, strings.TrimPrefix(containerPath, "/dev/"))
}

// idPrefix makes a readable device-ID stem from the resource name's last part:
// amd.com/gpu -> gpu, rdma/hca -> hca, rdma/ainic -> ainic.
func idPrefix(resourceName string) string {
	short := resourceName[strings.LastIndex(resourceName, "/")+1:]
	var b strings.Builder
	for _, r := range strings.ToLower(short) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '-' {
			b.WriteRune(r)
		}
	}
	if b.Len() == 0 {
		return "dev"
	}
	return b.String()
}

// Plan lays out every resource's devices. deviceDir must be absolute.
//
// GPU device gpuN gets /dev/kfd, /dev/dri/cardN and /dev/dri/renderD<128+N>.
// RDMA devices are numbered node-wide across all RDMA resources in flag order,
// as the kernel numbers them (rdma/hca=2 rdma/ainic=2 gives hca0 -> uverbs0,
// hca1 -> uverbs1, ainic0 -> uverbs2, ainic1 -> uverbs3), so a container given
// devices of two RDMA resources never sees two different host nodes at one
// container path.
func Plan(specs []ResourceSpec, deviceDir string) ([]*Resource, error) {
	if !filepath.IsAbs(deviceDir) {
		return nil, fmt.Errorf("device dir %q must be absolute", deviceDir)
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("no resources: give at least one --resource NAME=COUNT")
	}
	seen := map[string]bool{}
	var out []*Resource
	rdmaNext := 0
	for _, s := range specs {
		if seen[s.Name] {
			return nil, fmt.Errorf("resource %q given twice", s.Name)
		}
		seen[s.Name] = true
		r := &Resource{Name: s.Name, Kind: KindOf(s.Name), byID: map[string]*Device{}}
		prefix := idPrefix(s.Name)
		for i := 0; i < s.Count; i++ {
			d := &Device{ID: fmt.Sprintf("%s%d", prefix, i)}
			switch r.Kind {
			case KindGPU:
				d.Index = i
				// ROCm/k8s-device-plugin (internal/pkg/plugin/plugin.go,
				// Allocate): /dev/kfd once per container, then
				// /dev/dri/card<N> and /dev/dri/renderD<M> of each GPU,
				// container path == host path. The real plugin reads N and
				// M from sysfs; here M = 128+N.
				for _, p := range []string{
					"/dev/kfd",
					fmt.Sprintf("/dev/dri/card%d", i),
					fmt.Sprintf("/dev/dri/renderD%d", 128+i),
				} {
					d.Nodes = append(d.Nodes, Node{ContainerPath: p, HostPath: hostPathFor(deviceDir, p)})
				}
			case KindRDMA:
				d.Index = rdmaNext
				rdmaNext++
				// Mellanox/rdmamap GetRdmaCharDevices, used by both RDMA
				// references: for one RDMA device, in this order,
				// /dev/infiniband/issm<N>, umad<N>, uverbs<N> (ucm<N>
				// only exists on old kernels and is left out), then the
				// node-wide /dev/infiniband/rdma_cm.
				for _, n := range []struct{ key, path string }{
					{"issm", fmt.Sprintf("/dev/infiniband/issm%d", d.Index)},
					{"umad", fmt.Sprintf("/dev/infiniband/umad%d", d.Index)},
					{"uverbs", fmt.Sprintf("/dev/infiniband/uverbs%d", d.Index)},
					{"rdma_cm", "/dev/infiniband/rdma_cm"},
				} {
					d.Nodes = append(d.Nodes, Node{ContainerPath: n.path, HostPath: hostPathFor(deviceDir, n.path), EnvKey: n.key})
				}
			}
			r.Devices = append(r.Devices, d)
			r.byID[d.ID] = d
		}
		out = append(out, r)
	}
	return out, nil
}

// HostNodes lists every distinct host node of the resource (for mknod).
func (r *Resource) HostNodes() []string {
	seen := map[string]bool{}
	var out []string
	for _, d := range r.Devices {
		for _, n := range d.Nodes {
			if !seen[n.HostPath] {
				seen[n.HostPath] = true
				out = append(out, n.HostPath)
			}
		}
	}
	return out
}

// IDs lists the device IDs in index order.
func (r *Resource) IDs() []string {
	out := make([]string, len(r.Devices))
	for i, d := range r.Devices {
		out[i] = d.ID
	}
	return out
}

// ListDevices is what ListAndWatch sends: every device, all healthy. (The
// real plugins also attach NUMA topology; without a topology manager policy
// the kubelet ignores it, so none is sent.)
func (r *Resource) ListDevices() []*pluginapi.Device {
	out := make([]*pluginapi.Device, len(r.Devices))
	for i, d := range r.Devices {
		out[i] = &pluginapi.Device{ID: d.ID, Health: pluginapi.Healthy}
	}
	return out
}

// Options is what GetDevicePluginOptions returns.
func (r *Resource) Options() *pluginapi.DevicePluginOptions {
	if r.Kind == KindGPU {
		// ROCm/k8s-device-plugin: GetPreferredAllocationAvailable true
		// (false only when its topology allocator failed to start).
		return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}
	}
	// SR-IOV network device plugin and k8s-rdma-shared-dev-plugin: no
	// PreStartContainer, no GetPreferredAllocation.
	return &pluginapi.DevicePluginOptions{}
}

// lookup resolves device IDs, sorted by index so that a response does not
// depend on the order the kubelet listed them in.
func (r *Resource) lookup(ids []string) ([]*Device, error) {
	devs := make([]*Device, 0, len(ids))
	seen := map[string]bool{}
	for _, id := range ids {
		d, ok := r.byID[id]
		if !ok {
			return nil, fmt.Errorf("resource %s has no device %q (it has %s)", r.Name, id, strings.Join(r.IDs(), ","))
		}
		if !seen[id] {
			seen[id] = true
			devs = append(devs, d)
		}
	}
	sort.Slice(devs, func(i, j int) bool { return devs[i].Index < devs[j].Index })
	return devs, nil
}

// Allocate builds the ContainerAllocateResponse for one container.
func (r *Resource) Allocate(ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	devs, err := r.lookup(ids)
	if err != nil {
		return nil, err
	}
	resp := &pluginapi.ContainerAllocateResponse{}
	perm := gpuPermissions
	if r.Kind == KindRDMA {
		perm = rdmaPermissions
	}
	// Device nodes, shared ones once (ROCm adds /dev/kfd once; SR-IOV's
	// GetDeviceSpecs drops a spec whose host path is already listed).
	seen := map[string]bool{}
	for _, d := range devs {
		for _, n := range d.Nodes {
			if seen[n.HostPath] {
				continue
			}
			seen[n.HostPath] = true
			resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{
				ContainerPath: n.ContainerPath,
				HostPath:      n.HostPath,
				Permissions:   perm,
			})
		}
	}
	// GPU: ROCm/k8s-device-plugin sets no Envs, Mounts or Annotations.
	// RDMA: no Mounts (SR-IOV's rdma info provider returns none) and no
	// Annotations (both references set them only in CDI mode); Envs as the
	// SR-IOV network device plugin sets them (k8s-rdma-shared-dev-plugin
	// sets none).
	if r.Kind == KindRDMA {
		resp.Envs, err = r.sriovEnvs(devs)
		if err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// SRIOVEnvName is the SR-IOV network device plugin's variable name for a
// resource (pkg/resources/pool_stub.go, GetEnvs): PCIDEVICE_<PREFIX>_<NAME>,
// upper case. The reference only turns '.' into '_'; here every character
// that cannot appear in a shell variable name becomes '_' as well, so that
// rdma/hca -> PCIDEVICE_RDMA_HCA and example.com/ai-nic ->
// PCIDEVICE_EXAMPLE_COM_AI_NIC.
func SRIOVEnvName(resourceName string) string {
	key := "PCIDEVICE_" + strings.ReplaceAll(resourceName, "/", "_")
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') || r == '_':
			return r
		}
		return '_'
	}, key)
}

// sriovEnvs reproduces the SR-IOV network device plugin's two variables:
//
//	PCIDEVICE_<PREFIX>_<NAME>      = the allocated device IDs, comma-separated
//	PCIDEVICE_<PREFIX>_<NAME>_INFO = JSON {ID: {"generic": {"deviceID": ID},
//	                                 "rdma": {"issm": ..., "umad": ...,
//	                                 "uverbs": ..., "rdma_cm": ...,
//	                                 "rdma_dev": ...}}}
//
// In the reference the IDs are PCI addresses and rdma_dev is the kernel's RDMA
// device name (mlx5_0, ionic_0); here both are the readable device ID.
func (r *Resource) sriovEnvs(devs []*Device) (map[string]string, error) {
	ids := make([]string, len(devs))
	info := map[string]map[string]map[string]string{}
	for i, d := range devs {
		ids[i] = d.ID
		rdma := map[string]string{"rdma_dev": d.ID}
		for _, n := range d.Nodes {
			if n.EnvKey != "" {
				rdma[n.EnvKey] = n.ContainerPath
			}
		}
		info[d.ID] = map[string]map[string]string{
			"generic": {"deviceID": d.ID},
			"rdma":    rdma,
		}
	}
	js, err := json.Marshal(info)
	if err != nil {
		return nil, err
	}
	key := SRIOVEnvName(r.Name)
	return map[string]string{
		key:           strings.Join(ids, ","),
		key + "_INFO": string(js),
	}, nil
}

// Preferred answers GetPreferredAllocation for one container: the devices that
// must be included, then the lowest-numbered available ones. (ROCm's
// best-effort policy ranks by partition and NUMA topology, which a fake node
// does not have; lowest-first makes allocations predictable in tests.)
func (r *Resource) Preferred(available, mustInclude []string, size int) ([]string, error) {
	if size > len(available) {
		return nil, fmt.Errorf("resource %s: %d devices wanted, %d available", r.Name, size, len(available))
	}
	must, err := r.lookup(mustInclude)
	if err != nil {
		return nil, err
	}
	avail, err := r.lookup(available)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, size)
	taken := map[string]bool{}
	for _, d := range must {
		if len(out) == size {
			break
		}
		out = append(out, d.ID)
		taken[d.ID] = true
	}
	for _, d := range avail {
		if len(out) == size {
			break
		}
		if !taken[d.ID] {
			out = append(out, d.ID)
			taken[d.ID] = true
		}
	}
	return out, nil
}
