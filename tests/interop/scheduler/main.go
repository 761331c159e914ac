// Command kube-scheduler is a thin entry point around the upstream kube-scheduler command
// factory, so that the interop tests can build a real scheduler of a chosen release from the
// Go module proxy (see ../apiserver for why the module pins every staging module).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand()))
}
