package common

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// CDIClass is the device class of the CDI kind <driver>/<class> the specs are written under.
const CDIClass = "device"

type cdiDeviceNode struct {
	Path     string `json:"path"`
	HostPath string `json:"hostPath"`
}

type cdiMount struct {
	HostPath      string   `json:"hostPath"`
	ContainerPath string   `json:"containerPath"`
	Options       []string `json:"options"`
}

type cdiDevice struct {
	Name           string `json:"name"`
	ContainerEdits struct {
		DeviceNodes []cdiDeviceNode `json:"deviceNodes,omitempty"`
		Mounts      []cdiMount      `json:"mounts,omitempty"`
	} `json:"containerEdits"`
}

type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

// CDISpecPath is where the spec of one claim lies: one file per claim, so that unprepare
// removes exactly what prepare wrote.
func CDISpecPath(dir, driver, claimUID string) string {
	return filepath.Join(dir, strings.ReplaceAll(driver, "/", "_")+"-"+claimUID+".json")
}

// DeviceDirMount is where a device's DeviceDir appears in the container: /dev/dra/<device>.
const DeviceDirMount = "/dev/dra/"

// WriteCDISpec writes the spec of a claim's devices that have a DevicePath (a node at
// /dev/<device> in the container) or a DeviceDir (bind-mounted at /dev/dra/<device>), and
// returns the devices with their CDI IDs added.
// The file is renamed into place, so the runtime never reads half a spec.
func WriteCDISpec(dir, driver, claimUID string, devices []PreparedDevice) ([]PreparedDevice, error) {
	spec := cdiSpec{Version: "0.6.0", Kind: driver + "/" + CDIClass}
	out := make([]PreparedDevice, 0, len(devices))
	for _, d := range devices {
		if d.DevicePath != "" || d.DeviceDir != "" {
			dev := cdiDevice{Name: claimUID + "-" + d.Device}
			if d.DevicePath != "" {
				dev.ContainerEdits.DeviceNodes = []cdiDeviceNode{
					{Path: "/dev/" + d.Device, HostPath: d.DevicePath},
				}
			}
			if d.DeviceDir != "" {
				// A bind mount of the directory, not of the node: the runtime makes its own
				// copy of a device node, so a change on the host never reaches the
				// container; entries of a bind-mounted directory are the host's own.
				dev.ContainerEdits.Mounts = []cdiMount{{HostPath: d.DeviceDir,
					ContainerPath: DeviceDirMount + d.Device, Options: []string{"bind", "rw"}}}
			}
			spec.Devices = append(spec.Devices, dev)
			d.CDIDeviceIDs = append(append([]string(nil), d.CDIDeviceIDs...), spec.Kind+"="+dev.Name)
		}
		out = append(out, d)
	}
	if len(spec.Devices) == 0 {
		return out, nil
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return nil, err
	}
	path := CDISpecPath(dir, driver, claimUID)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return nil, fmt.Errorf("write CDI spec: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("write CDI spec: %w", err)
	}
	Emit("cdi_spec_written", map[string]any{"claim_uid": claimUID, "path": path})
	return out, nil
}

// RemoveCDISpec removes a claim's spec; a claim without one is no error.
func RemoveCDISpec(dir, driver, claimUID string) error {
	path := CDISpecPath(dir, driver, claimUID)
	err := os.Remove(path)
	if err == nil {
		Emit("cdi_spec_removed", map[string]any{"claim_uid": claimUID, "path": path})
		return nil
	}
	if os.IsNotExist(err) {
		return nil
	}
	return err
}
