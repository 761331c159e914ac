// Command interop-driver-v035 is the scripted DRA driver of the kubelet-dra interop tests,
// built on the Kubernetes 1.35 kubeletplugin helper. That helper has no version-neutral
// health hook: the driver implements the v1alpha1 DRAResourceHealthServer itself, and the
// helper advertises and serves v1alpha1.DRAResourceHealth because of that.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	healthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"

	"kubelet-dra/tests/interop/driver/common"
)

const helperVersion = "v0.35.10"

type driver struct {
	healthv1alpha1.UnimplementedDRAResourceHealthServer
	name    string
	control *common.Watcher
}

var _ healthv1alpha1.DRAResourceHealthServer = &driver{}

func (d *driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (
	map[types.UID]kubeletplugin.PrepareResult, error) {
	c, _ := d.control.Current()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		var res kubeletplugin.PrepareResult
		if c.PrepareError != "" {
			res.Err = errors.New(c.PrepareError)
		}
		for _, p := range common.PrepareList(c, d.name) {
			res.Devices = append(res.Devices, kubeletplugin.Device{
				Requests: p.Requests, PoolName: p.Pool, DeviceName: p.Device,
				CDIDeviceIDs: p.CDIDeviceIDs,
			})
		}
		out[claim.UID] = res
	}
	return out, nil
}

func (d *driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (
	map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		out[claim.UID] = nil
	}
	return out, nil
}

func (d *driver) HandleError(_ context.Context, err error, msg string) {
	common.Emit("handle_error", map[string]any{"error": err.Error(), "msg": msg,
		"recoverable": errors.Is(err, kubeletplugin.ErrRecoverable)})
}

// NodeWatchResources implements v1alpha1.DRAResourceHealth directly.
func (d *driver) NodeWatchResources(_ *healthv1alpha1.NodeWatchResourcesRequest,
	stream healthv1alpha1.DRAResourceHealth_NodeWatchResourcesServer) error {
	err := common.RunHealth(stream.Context(), d.control, "v1alpha1",
		func(devices []common.ControlDevice) error {
			resp := &healthv1alpha1.NodeWatchResourcesResponse{}
			for _, dev := range devices {
				resp.Devices = append(resp.Devices, &healthv1alpha1.DeviceHealth{
					Device: &healthv1alpha1.DeviceIdentifier{
						PoolName: dev.Pool, DeviceName: dev.Device,
					},
					Health:                    healthv1alpha1.HealthStatus(common.HealthCode(dev.Health)),
					LastUpdatedTime:           dev.LastUpdatedUnix(),
					HealthCheckTimeoutSeconds: dev.TimeoutSeconds,
				})
			}
			return stream.Send(resp)
		})
	if errors.Is(err, common.ErrNotSupported) {
		return status.Error(codes.Unimplemented, "device health reporting is not supported by this driver")
	}
	return err
}

func main() {
	cfg := common.ParseFlags(helperVersion)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		common.Emit("fatal", map[string]any{"error": err.Error()})
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg common.Config) error {
	if cfg.DisableHealth {
		return errors.New("--disable-health: the 1.35 helper has no option to turn health off")
	}
	watcher, err := common.NewWatcher(cfg.ControlFile)
	if err != nil {
		return err
	}
	go watcher.Run(ctx, time.Duration(cfg.PollIntervalMs)*time.Millisecond)
	client, err := common.NewClient(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(cfg.DriverName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(cfg.RegistryDir),
		kubeletplugin.PluginDataDirectoryPath(cfg.PluginDataDir),
		kubeletplugin.GRPCInterceptor(client.UnaryInterceptor()),
		kubeletplugin.GRPCStreamInterceptor(common.StreamInterceptor()),
	}
	if cfg.NodeName != "" {
		opts = append(opts, kubeletplugin.NodeName(cfg.NodeName))
	}
	helper, err := kubeletplugin.Start(ctx, &driver{name: cfg.DriverName, control: watcher}, opts...)
	if err != nil {
		return fmt.Errorf("start kubeletplugin helper: %w", err)
	}
	common.Emit("ready", map[string]any{
		"helper_version":      helperVersion,
		"driver":              cfg.DriverName,
		"registration_socket": filepath.Join(cfg.RegistryDir, cfg.DriverName+"-reg.sock"),
		"dra_socket":          filepath.Join(cfg.PluginDataDir, "dra.sock"),
	})
	<-ctx.Done()
	helper.Stop()
	common.Emit("stopped", map[string]any{})
	return nil
}
