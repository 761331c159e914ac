// Command kube-apiserver is a thin entry point around the upstream kube-apiserver command
// factory. It exists only so that the interop tests can build a real API server of a chosen
// release from the Go module proxy, without a Kubernetes source checkout.
package main

import (
	"os"
	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
