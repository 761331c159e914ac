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

type cdiDevice struct {
	Name           string `json:"name"`
	ContainerEdits struct {
		DeviceNodes []cdiDeviceNode `json:"deviceNodes"`
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

// WriteCDISpec writes the spec of a claim's devices that have a DevicePath, each at
// /dev/<device> in the container, and returns the devices with their CDI IDs added.
// The file is renamed into place, so the runtime never reads half a spec.
func WriteCDISpec(dir, driver, claimUID string, devices []PreparedDevice) ([]PreparedDevice, error) {
	spec := cdiSpec{Version: "0.6.0", Kind: driver + "/" + CDIClass}
	out := make([]PreparedDevice, 0, len(devices))
	for _, d := range devices {
		if d.DevicePath != "" {
			dev := cdiDevice{Name: claimUID + "-" + d.Device}
			dev.ContainerEdits.DeviceNodes = []cdiDeviceNode{
				{Path: "/dev/" + d.Device, HostPath: d.DevicePath},
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
