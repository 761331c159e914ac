// Command kubectl is the upstream kubectl command (k8s.io/kubectl's command factory) built
// from the Go module proxy, so that the tests can run `kubectl dra-health` through a real
// kubectl's plugin lookup without a Kubernetes checkout. cmd/kubectl in k8s.io/kubernetes is
// the same two calls; that module cannot be required for it without every staging replace.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		util.CheckErr(err)
	}
}
