// Command infera-device-plugin is a fake Kubernetes device plugin for Infera's
// one-node test cluster: it advertises AMD GPUs and RDMA NICs that do not
// exist through the kubelet's real device-plugin API, so the kubelet does its
// own scheduling and allocation accounting. See usage below and
// internal/fakedp.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/infera/testenv/device-plugin/internal/fakedp"
)

const usage = `infera-device-plugin: a fake device plugin for a test kubelet.

Usage:
  infera-device-plugin --resource NAME=COUNT [--resource NAME=COUNT ...]
                       [--device-dir DIR] [--plugin-dir DIR] [--poll-interval D]

Example:
  infera-device-plugin --resource amd.com/gpu=8 --resource rdma/hca=8 --resource rdma/ainic=4

It talks to the kubelet's real device-plugin gRPC API (v1beta1): for each
--resource it opens its own socket in --plugin-dir (infera-<name with / as _>.sock),
registers it on <plugin-dir>/kubelet.sock, and serves ListAndWatch, Allocate,
GetDevicePluginOptions, GetPreferredAllocation and PreStartContainer. Nodes
then show the resources in capacity/allocatable and the kubelet hands devices
to pods itself.

Resource kinds, chosen by name:
  amd.com/gpu    like the AMD GPU device plugin (ROCm/k8s-device-plugin).
                 Devices gpu0..gpuN-1. Allocate returns /dev/kfd once, then
                 /dev/dri/card<i> and /dev/dri/renderD<128+i> per GPU;
                 permissions rw; no env, mounts or annotations.
                 GetPreferredAllocation is offered (lowest-numbered first).
  anything else  like an RDMA NIC plugin for RoCE/AINIC (SR-IOV network device
                 plugin; node list of Mellanox rdmamap). Devices <last part of
                 the name><i>, e.g. hca0.., ainic0... Allocate returns per device
                 /dev/infiniband/issm<n>, umad<n>, uverbs<n>, and
                 /dev/infiniband/rdma_cm once; permissions rw; env
                 PCIDEVICE_<NAME>=<ids> and PCIDEVICE_<NAME>_INFO=<json>
                 (e.g. PCIDEVICE_RDMA_HCA). n numbers RDMA devices across all
                 RDMA resources in flag order (hca0..7 -> uverbs0..7,
                 ainic0..3 -> uverbs8..11).
All devices are always healthy.

Device nodes: the container path is the real one (/dev/kfd, ...); the host
path is a character device 1:3 (the numbers of /dev/null) that this program
creates with mknod under --device-dir (DIR/kfd, DIR/dri/card0,
DIR/infiniband/uverbs0, ...), never the host's own devices. Creating them
needs root; existing correct nodes are kept.

Kubelet restarts: every --poll-interval it checks its sockets and
kubelet.sock; when the kubelet has removed a socket or re-created
kubelet.sock, it re-creates the socket and registers again.
SIGTERM/SIGINT: stops the servers and removes its sockets.
Logs go to stderr: one line per registration and per Allocate.

Flags:
`

// resourceFlags collects repeated --resource NAME=COUNT flags.
type resourceFlags []fakedp.ResourceSpec

func (r *resourceFlags) String() string {
	parts := make([]string, len(*r))
	for i, s := range *r {
		parts[i] = s.String()
	}
	return strings.Join(parts, ",")
}

func (r *resourceFlags) Set(v string) error {
	s, err := fakedp.ParseResourceSpec(v)
	if err != nil {
		return err
	}
	*r = append(*r, s)
	return nil
}

// parseArgs turns the command line into a Config. It returns flag.ErrHelp for
// --help (usage already printed to out).
func parseArgs(args []string, out io.Writer) (fakedp.Config, error) {
	fs := flag.NewFlagSet("infera-device-plugin", flag.ContinueOnError)
	fs.SetOutput(out)
	var res resourceFlags
	cfg := fakedp.Config{}
	fs.Var(&res, "resource", "NAME=COUNT: advertise COUNT devices of extended resource NAME (repeatable; at least one)")
	fs.StringVar(&cfg.DeviceDir, "device-dir", fakedp.DefaultDeviceDir, "folder for the fake device nodes (host side of every DeviceSpec)")
	fs.StringVar(&cfg.PluginDir, "plugin-dir", fakedp.DefaultPluginDir, "the kubelet's device-plugin folder (holds kubelet.sock and this plugin's sockets)")
	fs.DurationVar(&cfg.PollInterval, "poll-interval", fakedp.DefaultPollInterval, "how often to check for a kubelet restart")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q (see --help)", fs.Arg(0))
	}
	if len(res) == 0 {
		return cfg, errors.New("give at least one --resource NAME=COUNT (see --help)")
	}
	cfg.Resources = res
	return cfg, nil
}

func run(args []string, stderr io.Writer) int {
	cfg, err := parseArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "infera-device-plugin: %v\n", err)
		return 2
	}
	cfg.Log = log.New(stderr, "infera-device-plugin: ", log.LstdFlags)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := fakedp.Run(ctx, cfg); err != nil {
		fmt.Fprintf(stderr, "infera-device-plugin: %v\n", err)
		return 1
	}
	return 0
}

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}
