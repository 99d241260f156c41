// Command etcd runs the etcd server at the version Kubernetes v1.33 pins,
// built from Go modules because no release binary can be downloaded here.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
