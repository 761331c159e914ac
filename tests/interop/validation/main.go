// Command validation reads JSON lines ["name" or "endpoint", text] on stdin and
// prints, for each, "ok" or the error of the kubelet's DRA registration handler
// (pkg/kubelet/cm/dra/plugin, DRAPluginManager.ValidatePlugin) for that driver
// name (with a valid endpoint) or endpoint (with a valid name). It runs the
// kubelet's own code: nothing here reimplements a check.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
)

const (
	validName     = "gpu.example.com"
	validEndpoint = "/var/lib/kubelet/plugins/gpu.example.com/dra.sock"
)

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// No client: the manager's ResourceSlice wiping is skipped without one.
	pm := plugin.NewDRAPluginManager(ctx, nil, nil, nil, 0)
	defer pm.Stop()
	services := []string{"v1.DRAPlugin"}

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for in.Scan() {
		var item [2]string
		if err := json.Unmarshal(in.Bytes(), &item); err != nil {
			fmt.Fprintln(os.Stderr, "bad input line:", err)
			os.Exit(2)
		}
		name, endpoint := validName, validEndpoint
		if item[0] == "name" {
			name = item[1]
		} else {
			endpoint = item[1]
		}
		if err := pm.ValidatePlugin(ctx, name, endpoint, services); err != nil {
			fmt.Fprintln(out, "refused: "+strings.ReplaceAll(err.Error(), "\n", " "))
		} else {
			fmt.Fprintln(out, "ok")
		}
	}
}
