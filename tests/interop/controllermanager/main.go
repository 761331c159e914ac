// Command kube-controller-manager is a thin entry point around the upstream
// kube-controller-manager command factory, so that the interop tests can run the real Job
// controller and device-taint-eviction controller of a chosen release (see ../apiserver for
// why the module pins every staging module).
package main

import (
	"os"
	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
