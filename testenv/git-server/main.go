// Command git-server serves the git repositories under one folder over git's smart HTTP
// protocol, for the GitOps tests: Flux's source-controller clones from it and the tests
// push to it, as they would with a hosted git service. It is `git http-backend` (from
// Debian's git) behind Go's CGI handler; Python 3.13 dropped `http.server --cgi`.
//
//	git-server --root DIR --listen ADDR [--backend PATH]
//
// Every repository under DIR is readable (GIT_HTTP_EXPORT_ALL); pushes are accepted
// where the repository's config says `http.receivepack true`. No authentication: it
// listens on the node's own address only. It prints `listening on ADDR` once it serves
// (ADDR with the port the kernel chose when --listen ends in :0), logs each request on
// stderr, and stops on SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	root := flag.String("root", "", "the folder holding the bare repositories (required)")
	listen := flag.String("listen", "127.0.0.1:0", "the address to serve on")
	backend := flag.String("backend", "/usr/lib/git-core/git-http-backend",
		"git's http-backend program (Debian's git installs it there)")
	flag.Parse()
	if *root == "" {
		log.Fatal("git-server: --root is required")
	}
	if _, err := os.Stat(*backend); err != nil {
		log.Fatalf("git-server: %s: %v (install Debian's git)", *backend, err)
	}
	handler := &cgi.Handler{
		Path: *backend,
		Env: []string{
			"GIT_PROJECT_ROOT=" + *root,
			"GIT_HTTP_EXPORT_ALL=1",
		},
		Stderr: os.Stderr,
	}
	logged := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started := time.Now()
		handler.ServeHTTP(w, r)
		log.Printf("%s %s %s (%s)", r.RemoteAddr, r.Method, r.URL.RequestURI(),
			time.Since(started).Round(time.Millisecond))
	})
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("git-server: listen on %s: %v", *listen, err)
	}
	fmt.Printf("listening on %s\n", listener.Addr())
	server := &http.Server{Handler: logged, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = server.Shutdown(shutdown)
	}()
	if err := server.Serve(listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatalf("git-server: %v", err)
	}
}
