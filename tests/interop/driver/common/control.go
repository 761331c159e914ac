// Package common holds the parts of the scripted interop test driver that do not depend on
// the version of the kubeletplugin helper: command line flags, the JSON control file that
// scripts device health, JSON event lines on stdout and the health sending loop.
package common

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ControlDevice is one scripted device health entry.
type ControlDevice struct {
	Pool           string `json:"pool"`
	Device         string `json:"device"`
	Health         string `json:"health"`
	Message        string `json:"message,omitempty"`
	TimeoutSeconds int64  `json:"timeout_seconds,omitempty"`
	// LastUpdated overrides last_updated_time (Unix seconds); 0 means "now" at send time.
	LastUpdated int64 `json:"last_updated,omitempty"`
}

// PreparedDevice is one device returned from NodePrepareResources for every claim.
type PreparedDevice struct {
	Requests     []string `json:"requests,omitempty"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	CDIDeviceIDs []string `json:"cdi_device_ids,omitempty"`
	// DevicePath, with --cdi-dir, is a host device node (or file) that prepare writes a CDI
	// spec for, so that the runtime injects it at /dev/<device>; its CDI ID is added.
	DevicePath string `json:"device_path,omitempty"`
	// DeviceDir, with --cdi-dir, is a host directory holding the device's node; the spec
	// bind-mounts it at /dev/dra/<device>, so that the node going away on the host (as when
	// a device drops off its bus) is seen inside the container.
	DeviceDir string `json:"device_dir,omitempty"`
}

// StreamError makes health streams fail with a gRPC status while it is set.
type StreamError struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

// Control is the content of the control file.
type Control struct {
	Devices []ControlDevice `json:"devices"`
	// Silent stops sending while keeping open streams open.
	Silent bool `json:"silent,omitempty"`
	// NotSupported makes health streams end with gRPC UNIMPLEMENTED.
	NotSupported bool `json:"not_supported,omitempty"`
	// ResendSeconds re-sends the current list periodically; 0 disables resending.
	ResendSeconds float64 `json:"resend_seconds,omitempty"`
	// StreamError, if set, ends open and new health streams with that status.
	StreamError *StreamError `json:"stream_error,omitempty"`
	// PrepareDevices are returned for each claim; if empty, one device per health entry.
	PrepareDevices []PreparedDevice `json:"prepare_devices,omitempty"`
	// PrepareError, if set, is returned as the per-claim error of NodePrepareResources.
	PrepareError string `json:"prepare_error,omitempty"`
}

// ErrNotSupported is returned by RunHealth when the script says health is not supported.
var ErrNotSupported = errors.New("health reporting disabled by the control file")

// Watcher polls the control file and publishes every change.
type Watcher struct {
	path    string
	mu      sync.Mutex
	current Control
	raw     []byte
	changed chan struct{}
}

// NewWatcher reads the control file once (a missing file means an empty script).
func NewWatcher(path string) (*Watcher, error) {
	w := &Watcher{path: path, changed: make(chan struct{})}
	if _, err := w.reload(); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *Watcher) reload() (bool, error) {
	if w.path == "" {
		return false, nil
	}
	data, err := os.ReadFile(w.path)
	if errors.Is(err, os.ErrNotExist) {
		data = []byte("{}")
	} else if err != nil {
		return false, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.raw != nil && bytes.Equal(data, w.raw) {
		return false, nil
	}
	var c Control
	if err := json.Unmarshal(data, &c); err != nil {
		// A half-written file: keep the old script and try again on the next poll.
		return false, fmt.Errorf("parse control file: %w", err)
	}
	w.raw = data
	w.current = c
	close(w.changed)
	w.changed = make(chan struct{})
	return true, nil
}

// Run polls every interval until ctx is done.
func (w *Watcher) Run(ctx context.Context, interval time.Duration) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			changed, err := w.reload()
			if err != nil {
				Emit("control_error", map[string]any{"error": err.Error()})
			} else if changed {
				Emit("control_loaded", map[string]any{})
			}
		}
	}
}

// Current returns the current script and a channel closed on its next change.
func (w *Watcher) Current() (Control, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.current, w.changed
}

// HealthCode maps a scripted health string to the wire enum number (UNKNOWN=0,
// HEALTHY=1, UNHEALTHY=2), which is the same in v1alpha1 and v1.
func HealthCode(s string) int32 {
	switch strings.ToUpper(s) {
	case "HEALTHY":
		return 1
	case "UNHEALTHY":
		return 2
	default:
		return 0
	}
}

var grpcCodes = map[string]codes.Code{
	"CANCELLED": codes.Canceled, "UNKNOWN": codes.Unknown, "INVALID_ARGUMENT": codes.InvalidArgument,
	"DEADLINE_EXCEEDED": codes.DeadlineExceeded, "NOT_FOUND": codes.NotFound,
	"PERMISSION_DENIED": codes.PermissionDenied, "RESOURCE_EXHAUSTED": codes.ResourceExhausted,
	"FAILED_PRECONDITION": codes.FailedPrecondition, "ABORTED": codes.Aborted,
	"UNIMPLEMENTED": codes.Unimplemented, "INTERNAL": codes.Internal,
	"UNAVAILABLE": codes.Unavailable,
}

func (e *StreamError) err() error {
	code, ok := grpcCodes[strings.ToUpper(e.Code)]
	if !ok {
		code = codes.Unknown
	}
	return status.Error(code, e.Message)
}

// RunHealth drives one health stream: it calls send with the scripted list at stream
// start, on every change of the script and every resend period, until ctx is done.
// It returns ErrNotSupported or a gRPC status error when the script asks for that.
func RunHealth(ctx context.Context, w *Watcher, stream string, send func([]ControlDevice) error) error {
	for {
		c, changed := w.Current()
		if c.NotSupported {
			Emit("stream_not_supported", map[string]any{"stream": stream})
			return ErrNotSupported
		}
		if c.StreamError != nil {
			Emit("stream_error", map[string]any{"stream": stream, "code": c.StreamError.Code})
			return c.StreamError.err()
		}
		if !c.Silent {
			if err := send(c.Devices); err != nil {
				return err
			}
			Emit("sent", map[string]any{"stream": stream, "devices": len(c.Devices)})
		}
		var resend <-chan time.Time
		var timer *time.Timer
		if c.ResendSeconds > 0 {
			timer = time.NewTimer(time.Duration(c.ResendSeconds * float64(time.Second)))
			resend = timer.C
		}
		select {
		case <-ctx.Done():
		case <-changed:
		case <-resend:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// LastUpdatedUnix returns the Unix time to put on the wire for d.
func (d ControlDevice) LastUpdatedUnix() int64 {
	if d.LastUpdated != 0 {
		return d.LastUpdated
	}
	return time.Now().Unix()
}
