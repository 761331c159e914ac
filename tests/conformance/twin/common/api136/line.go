// Package api136 adapts the twin to the DRA manager of Kubernetes 1.36: GetNodeFunc
// takes a context, the plugin handler methods do not, UpdateAllocatedResourcesStatus takes no
// logger, and the manager has no Stop (cancelling Start's context ends its work).
package api136

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"

	twin "kubelet-dra/tests/conformance/twin/common"
)

// Line implements twin.Line for 1.36.
type Line struct{}

var _ twin.Line = Line{}

func (Line) Start(ctx context.Context, m *dra.Manager, activePods dra.ActivePodsFunc, node *v1.Node) error {
	return m.Start(ctx, activePods, func(context.Context) (*v1.Node, error) { return node, nil }, twin.NeverReady{})
}

func (Line) Validate(_ context.Context, m *dra.Manager, driver, endpoint string, services []string) error {
	return m.GetWatcherHandler().ValidatePlugin(driver, endpoint, services)
}

func (Line) Register(_ context.Context, m *dra.Manager, driver, endpoint string, services []string) error {
	return m.GetWatcherHandler().RegisterPlugin(driver, endpoint, services, nil)
}

func (Line) Deregister(_ context.Context, m *dra.Manager, driver, endpoint string) {
	m.GetWatcherHandler().DeRegisterPlugin(driver, endpoint)
}

func (Line) UpdateStatus(_ klog.Logger, m *dra.Manager, pod *v1.Pod, status *v1.PodStatus) {
	m.UpdateAllocatedResourcesStatus(pod, status)
}

func (Line) Stop(*dra.Manager) bool { return false }
