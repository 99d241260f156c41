package fakedp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Defaults for the flags.
const (
	DefaultDeviceDir    = "/var/lib/infera-cluster/devices"
	DefaultPluginDir    = "/var/lib/kubelet/device-plugins"
	DefaultPollInterval = time.Second
	kubeletSocketName   = "kubelet.sock"
	registerTimeout     = 15 * time.Second // the kubelet itself waits up to 10 s to dial us back
	gracefulStopTimeout = 3 * time.Second
)

// Config is the plugin's configuration (one per process).
type Config struct {
	Resources []ResourceSpec
	// DeviceDir holds the fake device nodes (made absolute by New).
	DeviceDir string
	// PluginDir is the kubelet's device-plugin folder; kubelet.sock is in it
	// and the plugin's own sockets are put in it.
	PluginDir string
	// PollInterval is how often kubelet.sock and the plugin's sockets are
	// checked (kubelet restarts).
	PollInterval time.Duration
	// SkipDeviceNodes leaves out mknod (unit tests not running as root).
	SkipDeviceNodes bool
	// Log receives one line per event; nil means stderr.
	Log *log.Logger
}

// SocketName is the file name of a resource's socket in the plugin dir:
// amd.com/gpu -> infera-amd.com_gpu.sock.
func SocketName(resourceName string) string {
	return "infera-" + strings.ReplaceAll(resourceName, "/", "_") + ".sock"
}

// fileID identifies one incarnation of a file: a socket that is removed and
// created again gets another inode or at least another ctime.
type fileID struct {
	dev, ino  uint64
	sec, nsec int64
}

func statID(path string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino, sec: int64(st.Ctim.Sec), nsec: int64(st.Ctim.Nsec)}, nil
}

// plugin is one resource's socket, gRPC server and registration state. Only
// the manager's loop goroutine (or Start/Stop, which exclude it) touches it.
type plugin struct {
	res        *Resource
	socketName string
	socketPath string
	svc        *service

	srv      *grpc.Server
	served   chan struct{} // closed when srv.Serve returns
	sockID   fileID        // the socket file this process created
	regWith  fileID        // kubelet.sock incarnation it is registered with
	isReg    bool
	lastNote string // last failure logged, to log each distinct failure once
}

// Manager runs one plugin per resource and keeps them registered.
type Manager struct {
	cfg         Config
	log         *log.Logger
	resources   []*Resource
	plugins     []*plugin
	kubeletSock string

	stopping chan struct{}
	loopDone chan struct{}
	stopOnce sync.Once
}

// New plans the resources and creates their device nodes. It does not yet
// touch the plugin dir.
func New(cfg Config) (*Manager, error) {
	if cfg.Log == nil {
		cfg.Log = log.New(os.Stderr, "infera-device-plugin: ", log.LstdFlags)
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.DeviceDir == "" {
		cfg.DeviceDir = DefaultDeviceDir
	}
	if cfg.PluginDir == "" {
		cfg.PluginDir = DefaultPluginDir
	}
	var err error
	if cfg.DeviceDir, err = filepath.Abs(cfg.DeviceDir); err != nil {
		return nil, err
	}
	if cfg.PluginDir, err = filepath.Abs(cfg.PluginDir); err != nil {
		return nil, err
	}
	res, err := Plan(cfg.Resources, cfg.DeviceDir)
	if err != nil {
		return nil, err
	}
	m := &Manager{
		cfg:         cfg,
		log:         cfg.Log,
		resources:   res,
		kubeletSock: filepath.Join(cfg.PluginDir, kubeletSocketName),
		stopping:    make(chan struct{}),
		loopDone:    make(chan struct{}),
	}
	if !cfg.SkipDeviceNodes {
		n, err := EnsureNodes(res)
		if err != nil {
			return nil, err
		}
		m.log.Printf("%d device nodes (character device %d:%d) ready under %s", n, nullMajor, nullMinor, cfg.DeviceDir)
	}
	for _, r := range res {
		name := SocketName(r.Name)
		m.plugins = append(m.plugins, &plugin{
			res:        r,
			socketName: name,
			socketPath: filepath.Join(cfg.PluginDir, name),
			svc:        &service{res: r, log: m.log, stopping: m.stopping},
		})
	}
	return m, nil
}

// Resources returns the planned resources.
func (m *Manager) Resources() []*Resource { return m.resources }

// KubeletSocket is the registration socket the manager watches.
func (m *Manager) KubeletSocket() string { return m.kubeletSock }

// SocketPath is where a resource's plugin listens.
func (m *Manager) SocketPath(resourceName string) string {
	return filepath.Join(m.cfg.PluginDir, SocketName(resourceName))
}

// Start opens every plugin socket, registers with the kubelet if it is there,
// and starts the loop that re-creates sockets and re-registers after a
// kubelet restart. A socket that cannot be opened fails Start; a kubelet that
// is not up yet does not (registration is retried every poll interval).
func (m *Manager) Start() error {
	if err := os.MkdirAll(m.cfg.PluginDir, 0o750); err != nil {
		return err
	}
	for _, p := range m.plugins {
		if err := m.serve(p); err != nil {
			m.shutdownServers()
			return err
		}
		m.log.Printf("serving %s (%s, %d devices: %s) on %s", p.res.Name, p.res.Kind, len(p.res.Devices), idRange(p.res.IDs()), p.socketPath)
	}
	m.sync()
	go m.loop()
	return nil
}

// Stop ends the loop, stops every gRPC server and removes the sockets this
// process created. Safe to call more than once.
func (m *Manager) Stop() {
	m.stopOnce.Do(func() {
		close(m.stopping)
		<-m.loopDone
		m.shutdownServers()
	})
}

// Run starts the manager and stops it when ctx ends.
func Run(ctx context.Context, cfg Config) error {
	m, err := New(cfg)
	if err != nil {
		return err
	}
	if err := m.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	m.log.Printf("stopping: %v", context.Cause(ctx))
	m.Stop()
	m.log.Printf("stopped; sockets removed")
	return nil
}

func (m *Manager) loop() {
	defer close(m.loopDone)
	t := time.NewTicker(m.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-m.stopping:
			return
		case <-t.C:
			m.sync()
		}
	}
}

// sync is one pass of the watch: re-create a plugin socket that is gone (the
// kubelet removes every socket in its folder when it starts), and register
// each plugin that is not registered with the current kubelet.sock.
func (m *Manager) sync() {
	kid, kerr := statID(m.kubeletSock)
	for _, p := range m.plugins {
		select {
		case <-m.stopping:
			return
		default:
		}
		sid, serr := statID(p.socketPath)
		if serr != nil || sid != p.sockID {
			m.log.Printf("socket %s is gone or replaced (kubelet restart?); re-creating it", p.socketPath)
			if err := m.serve(p); err != nil {
				m.note(p, fmt.Sprintf("cannot re-create socket for %s: %v", p.res.Name, err))
				continue
			}
		}
		if kerr != nil {
			if p.isReg {
				m.log.Printf("%s: %s is gone (kubelet stopped?)", p.res.Name, m.kubeletSock)
				p.isReg = false
			}
			m.note(p, fmt.Sprintf("%s: waiting for the kubelet to create %s", p.res.Name, m.kubeletSock))
			continue
		}
		if p.isReg && p.regWith == kid {
			continue
		}
		if err := m.register(p); err != nil {
			p.isReg = false
			m.note(p, fmt.Sprintf("registering %s with %s failed (will retry): %v", p.res.Name, m.kubeletSock, err))
			continue
		}
		p.isReg, p.regWith, p.lastNote = true, kid, ""
		m.log.Printf("registered %s with the kubelet: endpoint %s, %d devices (%s)", p.res.Name, p.socketName, len(p.res.Devices), idRange(p.res.IDs()))
	}
}

// note logs a failure once until it changes.
func (m *Manager) note(p *plugin, msg string) {
	if msg != p.lastNote {
		m.log.Print(msg)
		p.lastNote = msg
	}
}

// serve (re)creates a plugin's socket and gRPC server.
func (m *Manager) serve(p *plugin) error {
	m.stopServer(p, false)
	if err := os.Remove(p.socketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	ln, err := net.Listen("unix", p.socketPath)
	if err != nil {
		return err
	}
	// The socket is removed by this process only if it is still the file it
	// created (see removeSocket), never by the listener's Close.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	id, err := statID(p.socketPath)
	if err != nil {
		ln.Close()
		return err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p.svc)
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil {
			m.log.Printf("%s: gRPC server ended: %v", p.res.Name, err)
		}
	}()
	p.srv, p.served, p.sockID, p.isReg = srv, served, id, false
	return nil
}

// stopServer stops a plugin's gRPC server; graceful lets open calls finish
// (ListAndWatch streams end once m.stopping is closed).
func (m *Manager) stopServer(p *plugin, graceful bool) {
	if p.srv == nil {
		return
	}
	if graceful {
		done := make(chan struct{})
		go func() { p.srv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(gracefulStopTimeout):
			p.srv.Stop()
		}
	} else {
		p.srv.Stop()
	}
	<-p.served
	p.srv, p.served = nil, nil
}

func (m *Manager) shutdownServers() {
	for _, p := range m.plugins {
		m.stopServer(p, true)
		m.removeSocket(p)
	}
}

// removeSocket deletes the plugin's socket if it is the one this process made.
func (m *Manager) removeSocket(p *plugin) {
	id, err := statID(p.socketPath)
	if err != nil || id != p.sockID {
		return
	}
	if err := os.Remove(p.socketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		m.log.Printf("removing %s: %v", p.socketPath, err)
	}
}

// register calls the kubelet's Registration service.
func (m *Manager) register(p *plugin) error {
	conn, err := grpc.NewClient("unix://"+m.kubeletSock,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("localhost"))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), registerTimeout)
	defer cancel()
	go func() { // let Stop interrupt a registration in progress
		select {
		case <-m.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     p.socketName,
		ResourceName: p.res.Name,
		Options:      p.res.Options(),
	})
	return err
}

// Discard is a logger that drops everything (for tests).
var Discard = log.New(io.Discard, "", 0)
