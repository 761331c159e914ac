// Command etcd runs the upstream etcd server entry point unchanged. The interop tests build it
// from the Go module proxy so that no system etcd package is needed.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
