// Package api137 adapts the twin to the DRA manager of Kubernetes 1.37 and later: GetNodeFunc
// and the plugin handler methods take a context, UpdateAllocatedResourcesStatus takes a logger,
// and the manager has Stop.
package api137

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"

	twin "kubelet-dra/tests/conformance/twin/common"
)

// Line implements twin.Line for 1.37 and later.
type Line struct{}

var _ twin.Line = Line{}

func (Line) Start(ctx context.Context, m *dra.Manager, activePods dra.ActivePodsFunc, node *v1.Node) error {
	getNode := func(context.Context) (*v1.Node, error) { return node, nil }
	return m.Start(ctx, activePods, getNode, twin.NeverReady{})
}

func (Line) Validate(ctx context.Context, m *dra.Manager, driver, endpoint string, services []string) error {
	return m.GetWatcherHandler().ValidatePlugin(ctx, driver, endpoint, services)
}

func (Line) Register(ctx context.Context, m *dra.Manager, driver, endpoint string, services []string) error {
	return m.GetWatcherHandler().RegisterPlugin(ctx, driver, endpoint, services, nil)
}

func (Line) Deregister(ctx context.Context, m *dra.Manager, driver, endpoint string) {
	m.GetWatcherHandler().DeRegisterPlugin(ctx, driver, endpoint)
}

func (Line) UpdateStatus(logger klog.Logger, m *dra.Manager, pod *v1.Pod, status *v1.PodStatus) {
	m.UpdateAllocatedResourcesStatus(logger, pod, status)
}

func (Line) Stop(m *dra.Manager) bool {
	m.Stop()
	return true
}
