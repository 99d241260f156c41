package fakedp

import (
	"context"
	"log"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// service implements the kubelet's DevicePlugin gRPC service for one resource.
type service struct {
	res *Resource
	log *log.Logger
	// stopping is closed at shutdown so that open ListAndWatch streams end
	// and the gRPC server can stop gracefully.
	stopping <-chan struct{}
}

var _ pluginapi.DevicePluginServer = (*service)(nil)

// GetDevicePluginOptions: see Resource.Options.
func (s *service) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return s.res.Options(), nil
}

// ListAndWatch sends the device list once (every device stays healthy) and
// keeps the stream open until the kubelet closes it or the plugin stops.
func (s *service) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: s.res.ListDevices()}); err != nil {
		s.log.Printf("ListAndWatch %s: send failed: %v", s.res.Name, err)
		return err
	}
	s.log.Printf("ListAndWatch %s: sent %d healthy devices (%s)", s.res.Name, len(s.res.Devices), idRange(s.res.IDs()))
	select {
	case <-stream.Context().Done():
	case <-s.stopping:
	}
	return nil
}

// GetPreferredAllocation: see Resource.Preferred. The kubelet calls it only
// when Options says it is available (the GPU kind).
func (s *service) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.ContainerRequests {
		ids, err := s.res.Preferred(cr.AvailableDeviceIDs, cr.MustIncludeDeviceIDs, int(cr.AllocationSize))
		if err != nil {
			s.log.Printf("GetPreferredAllocation %s: %v", s.res.Name, err)
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		resp.ContainerResponses = append(resp.ContainerResponses,
			&pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Allocate answers with the device nodes (and, for RDMA, the environment) of
// the allocated devices; one log line per container.
func (s *service) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.ContainerRequests {
		car, err := s.res.Allocate(cr.DevicesIDs)
		if err != nil {
			s.log.Printf("Allocate %s [%s]: refused: %v", s.res.Name, strings.Join(cr.DevicesIDs, ","), err)
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		paths := make([]string, len(car.Devices))
		for i, d := range car.Devices {
			paths[i] = d.ContainerPath
		}
		s.log.Printf("Allocate %s [%s]: %d device nodes (%s), %d env vars",
			s.res.Name, strings.Join(cr.DevicesIDs, ","), len(car.Devices), strings.Join(paths, " "), len(car.Envs))
		resp.ContainerResponses = append(resp.ContainerResponses, car)
	}
	return resp, nil
}

// PreStartContainer is never required (PreStartRequired is false, as in all
// three references); it answers empty if called.
func (s *service) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// idRange prints gpu0..gpu7 for a run of IDs.
func idRange(ids []string) string {
	switch len(ids) {
	case 0:
		return "none"
	case 1:
		return ids[0]
	}
	return ids[0] + ".." + ids[len(ids)-1]
}
