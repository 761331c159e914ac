package api136

import (
	"unsafe"

	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra/state"

	twin "kubelet-dra/tests/conformance/twin/common"
)

// getHealthInfo is the DRA manager's own (*healthInfoCache).getHealthInfo, called through a
// link name: the package exports no reader of one device's health. From 1.36 on it
// returns health and message. The receiver is the manager's cache (twin.HealthInfoCache);
// health.s lets this declaration have no body.
//
//go:linkname getHealthInfo k8s.io/kubernetes/pkg/kubelet/cm/dra.(*healthInfoCache).getHealthInfo
func getHealthInfo(cache unsafe.Pointer, driverName, poolName, deviceName string) state.DeviceHealth

// DeviceHealth implements twin.Line: what getHealthInfo returns for the device now.
func (Line) DeviceHealth(m *dra.Manager, driver, pool, device string) (string, string) {
	info := getHealthInfo(twin.HealthInfoCache(m), driver, pool, device)
	return string(info.Health), info.Message
}
