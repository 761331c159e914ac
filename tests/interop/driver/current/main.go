// Command interop-driver is a scripted DRA driver for the kubelet-dra interop tests, built on
// the k8s.io/dynamic-resource-allocation kubeletplugin helper of the newest release. Device
// health comes from a JSON control file; see the common module for its format. With
// --cdi-dir, prepare writes CDI specs for the devices the control file gives a device_path.
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

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"kubelet-dra/tests/interop/driver/common"
)

const helperVersion = "v0.37.2"

type driver struct {
	name    string
	control *common.Watcher
	// cdiDir, if set, is where prepare writes a CDI spec per claim (common.WriteCDISpec).
	cdiDir string
}

func (d *driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (
	map[types.UID]kubeletplugin.PrepareResult, error) {
	c, _ := d.control.Current()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		var res kubeletplugin.PrepareResult
		if c.PrepareError != "" {
			res.Err = errors.New(c.PrepareError)
		}
		prepared := common.PrepareList(c, d.name)
		if d.cdiDir != "" && res.Err == nil {
			var err error
			if prepared, err = common.WriteCDISpec(d.cdiDir, d.name, string(claim.UID), prepared); err != nil {
				res.Err = err
			}
		}
		for _, p := range prepared {
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
		if d.cdiDir != "" {
			out[claim.UID] = common.RemoveCDISpec(d.cdiDir, d.name, string(claim.UID))
		}
	}
	return out, nil
}

func (d *driver) HandleError(_ context.Context, err error, msg string) {
	common.Emit("handle_error", map[string]any{"error": err.Error(), "msg": msg,
		"recoverable": errors.Is(err, kubeletplugin.ErrRecoverable)})
}

func (d *driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	err := common.RunHealth(ctx, d.control, "neutral", func(devices []common.ControlDevice) error {
		report := kubeletplugin.DeviceHealthReport{}
		for _, dev := range devices {
			health := kubeletplugin.HealthStatusUnknown
			switch common.HealthCode(dev.Health) {
			case 1:
				health = kubeletplugin.HealthStatusHealthy
			case 2:
				health = kubeletplugin.HealthStatusUnhealthy
			}
			report.Devices = append(report.Devices, kubeletplugin.DeviceHealth{
				PoolName: dev.Pool, DeviceName: dev.Device, Health: health,
				LastUpdated:        time.Unix(dev.LastUpdatedUnix(), 0),
				HealthCheckTimeout: time.Duration(dev.TimeoutSeconds) * time.Second,
				Message:            dev.Message,
			})
		}
		select {
		case <-ctx.Done():
			return nil
		case reports <- report:
			return nil
		}
	})
	if errors.Is(err, common.ErrNotSupported) {
		return kubeletplugin.ErrHealthNotSupported
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
	if cfg.DisableHealth {
		opts = append(opts, kubeletplugin.HealthService(false))
	}
	helper, err := kubeletplugin.Start(ctx, &driver{name: cfg.DriverName, control: watcher, cdiDir: cfg.CDIDir}, opts...)
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
