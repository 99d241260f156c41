// Command pause is the pod sandbox's process, a stand-in for Kubernetes'
// pause image (build/pause/linux/pause.c) that builds from Go's standard
// library alone, since no container registry can be reached here.
//
// Like pause.c it holds the pod's namespaces open and, as PID 1 of the pod's
// PID namespace (shareProcessNamespace), reaps the zombies reparented to it
// on SIGCHLD; it exits 0 on SIGINT or SIGTERM and otherwise waits forever.
// `-v` prints its version and exits.
//
// Build it static: CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' .
package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// version is the pause image version this binary stands in for; override
// with -ldflags '-X main.version=...'.
var version = "3.10"

func main() {
	for _, arg := range os.Args[1:] {
		if strings.EqualFold(arg, "-v") {
			fmt.Printf("pause.go v%s (infera testenv)\n", version)
			return
		}
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "Warning: pause should be the first process")
	}

	// Separate channels, so a burst of SIGCHLD can never crowd out a
	// shutdown signal. One pending SIGCHLD is enough: each reap pass takes
	// every child that has exited.
	down := make(chan os.Signal, 1)
	signal.Notify(down, syscall.SIGINT, syscall.SIGTERM)
	child := make(chan os.Signal, 1)
	signal.Notify(child, syscall.SIGCHLD)

	// Children that exited before the handler was installed sent their
	// SIGCHLD to nobody.
	reap()
	for {
		select {
		case sig := <-down:
			fmt.Fprintf(os.Stderr, "Shutting down, got signal: %v\n", sig)
			os.Exit(0)
		case <-child:
			reap()
		}
	}
}

// reap collects every exited child without blocking.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 { // ECHILD: no children; 0: none exited yet
			return
		}
	}
}
