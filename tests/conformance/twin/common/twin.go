// Package twin runs the kubelet's own DRA manager (k8s.io/kubernetes/pkg/kubelet/cm/dra)
// in-process and drives it with JSON-line commands on stdin (tests/conformance/PROTOCOL.md).
//
// This package is compiled by each per-line module under tests/conformance/twin/ against that
// line's k8s.io/kubernetes; the few calls whose signatures differ between lines go through
// the Line interface, implemented by the small shim packages next to this one.
package twin

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"sort"
	"sync"
	"time"
	"unsafe"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/component-base/featuregate"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
)

// HealthStateFile is the health checkpoint the manager writes into its state directory.
const HealthStateFile = "dra_health_state"

// Line is what differs between upstream lines: the signatures of Start (GetNodeFunc), the
// plugin handler (with or without a context) and UpdateAllocatedResourcesStatus (with or
// without a logger), and whether the manager has Stop.
type Line interface {
	Start(ctx context.Context, m *dra.Manager, activePods dra.ActivePodsFunc, node *v1.Node) error
	Validate(ctx context.Context, m *dra.Manager, driver, endpoint string, services []string) error
	Register(ctx context.Context, m *dra.Manager, driver, endpoint string, services []string) error
	Deregister(ctx context.Context, m *dra.Manager, driver, endpoint string)
	UpdateStatus(logger klog.Logger, m *dra.Manager, pod *v1.Pod, status *v1.PodStatus)
	// Stop stops the manager's background work; false if this line has no Manager.Stop.
	Stop(m *dra.Manager) bool
	// DeviceHealth is what the manager's own getHealthInfo returns for one device now:
	// health and message (no message up to 1.35, whose getHealthInfo returns none).
	DeviceHealth(m *dra.Manager, driver, pool, device string) (string, string)
}

// HealthInfoCache is the manager's health cache (its unexported healthInfoCache field), for
// a shim to call the cache's own getHealthInfo on: the manager has no exported way to read
// one device's health, and the twin must not compute it itself.
func HealthInfoCache(m *dra.Manager) unsafe.Pointer {
	return reflect.ValueOf(m).Elem().FieldByName("healthInfoCache").UnsafePointer()
}

// Gates enabled when this line knows them (DynamicResourceAllocation is no gate in 1.38).
var Gates = []string{"DynamicResourceAllocation", "ResourceHealthStatus", "ResourceHealthStatusMessage"}

// NeverReady is the config.SourcesReady given to Start. It keeps the manager's reconcile
// loop idle: pods are unprepared only when the runner says so, so a scenario never races
// the 60 s reconcile period.
type NeverReady struct{}

// AddSource is part of config.SourcesReady.
func (NeverReady) AddSource(string) {}

// AllReady is part of config.SourcesReady; always false (see the type).
func (NeverReady) AllReady() bool { return false }

// Twin holds one manager and the state the protocol needs.
type Twin struct {
	line    Line
	version string
	out     *json.Encoder
	logger  klog.Logger
	ctx     context.Context
	cancel  context.CancelFunc

	client   *fake.Clientset
	manager  *dra.Manager
	stateDir string
	gates    map[string]bool

	mu        sync.Mutex
	announced map[string]bool
	updates   [][]string
	lastRecv  time.Time
	drained   chan struct{}
	// pause and resume hand the drain goroutine over to a busy sync loop (pause_updates)
	// and back (the next sync); paused is only touched by the command loop.
	pause  chan struct{}
	resume chan struct{}
	paused bool
}

type request struct {
	Op       string            `json:"op"`
	StateDir string            `json:"stateDir"`
	NodeName string            `json:"nodeName"`
	Claims   []json.RawMessage `json:"claims"`
	Driver   string            `json:"driver"`
	Endpoint string            `json:"endpoint"`
	Services []string          `json:"services"`
	Pod      json.RawMessage   `json:"pod"`
	Pods     []json.RawMessage `json:"pods"`
	SettleMs *int              `json:"settleMs"`
	// sync: the devices whose view (getHealthInfo) the reply gives, [driver, pool, device]
	Devices [][3]string `json:"devices"`
	// wait_state
	Pool      string  `json:"pool"`
	Device    string  `json:"device"`
	Health    *string `json:"health"`
	Message   *string `json:"message"`
	Absent    bool    `json:"absent"`
	TimeoutMs int     `json:"timeoutMs"`
}

type reply map[string]any

// KubernetesVersion is the k8s.io/kubernetes version this binary was built with.
func KubernetesVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "k8s.io/kubernetes" {
				return dep.Version
			}
		}
	}
	return "unknown"
}

// Main runs the command loop on stdin/stdout until `stop` or end of input. Command-line
// flags are klog's (e.g. -v=5 for the manager's detailed logs on stderr).
func Main(line Line) {
	klog.InitFlags(nil)
	flag.Parse()
	version := KubernetesVersion()
	logger := klog.NewKlogr()
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	t := &Twin{
		line:      line,
		version:   version,
		out:       json.NewEncoder(os.Stdout),
		logger:    logger,
		ctx:       ctx,
		cancel:    cancel,
		announced: map[string]bool{},
	}
	in := bufio.NewReader(os.Stdin)
	for {
		raw, err := in.ReadBytes('\n')
		if len(raw) > 0 {
			if stop := t.handle(raw); stop {
				cancel()
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				fmt.Fprintf(os.Stderr, "twin: reading stdin: %v\n", err)
			}
			t.shutdown()
			cancel()
			return
		}
	}
}

func (t *Twin) handle(raw []byte) (stop bool) {
	var req request
	if err := json.Unmarshal(raw, &req); err != nil {
		t.send(reply{"ok": false, "error": fmt.Sprintf("bad request: %v", err)})
		return false
	}
	var rep reply
	var err error
	switch req.Op {
	case "start":
		rep, err = t.start(req)
	case "claims":
		rep, err = t.claims(req)
	case "register":
		rep, err = t.register(req)
	case "deregister":
		rep, err = t.deregister(req)
	case "prepare":
		rep, err = t.prepare(req, true)
	case "unprepare":
		rep, err = t.prepare(req, false)
	case "sync":
		rep, err = t.sync(req)
	case "state":
		rep, err = t.state()
	case "wait_state":
		rep, err = t.waitState(req)
	case "pause_updates":
		rep, err = t.pauseUpdates()
	case "stop":
		stopped := t.shutdown()
		t.send(reply{"ok": true, "stopped": stopped})
		return true
	default:
		err = fmt.Errorf("unknown op %q", req.Op)
	}
	if err != nil {
		t.send(reply{"ok": false, "error": err.Error()})
		return false
	}
	if rep == nil {
		rep = reply{}
	}
	rep["ok"] = true
	t.send(rep)
	return false
}

func (t *Twin) send(r reply) {
	if err := t.out.Encode(r); err != nil {
		fmt.Fprintf(os.Stderr, "twin: writing reply: %v\n", err)
		os.Exit(3)
	}
}

func (t *Twin) needStarted() error {
	if t.manager == nil {
		return errors.New("the manager is not started (send start first)")
	}
	return nil
}

// enableGates turns on every gate of Gates that this line knows and reports what it set.
func enableGates() (map[string]bool, error) {
	known := utilfeature.DefaultMutableFeatureGate.GetAll()
	set := map[string]bool{}
	for _, name := range Gates {
		if _, ok := known[featuregate.Feature(name)]; ok {
			set[name] = true
		}
	}
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(set); err != nil {
		return nil, fmt.Errorf("feature gates %v: %w", set, err)
	}
	return set, nil
}

func (t *Twin) start(req request) (reply, error) {
	if t.manager != nil {
		return nil, errors.New("already started")
	}
	if req.StateDir == "" {
		return nil, errors.New("start needs stateDir")
	}
	gates, err := enableGates()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(req.StateDir, 0o750); err != nil {
		return nil, err
	}
	nodeName := req.NodeName
	if nodeName == "" {
		nodeName = "twin-node"
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: "twin-node-uid"}}
	t.client = fake.NewSimpleClientset(node)
	m, err := dra.NewManager(t.logger, t.client, req.StateDir)
	if err != nil {
		return nil, fmt.Errorf("NewManager: %w", err)
	}
	activePods := func() []*v1.Pod { return nil }
	if err := t.line.Start(t.ctx, m, activePods, node); err != nil {
		return nil, fmt.Errorf("Start: %w", err)
	}
	t.manager, t.stateDir, t.gates = m, req.StateDir, gates
	t.drained = make(chan struct{})
	t.pause, t.resume = make(chan struct{}), make(chan struct{})
	go t.drain()
	return reply{"version": t.version, "gates": gates}, nil
}

// drain reads Updates() the way an idle kubelet sync loop does, so the manager's buffered
// channel (100 entries, drop when full) never fills because of us; after pause_updates it
// reads nothing until the next sync (a sync loop busy elsewhere).
func (t *Twin) drain() {
	defer close(t.drained)
	ch := t.manager.Updates()
	for {
		select {
		case <-t.ctx.Done():
			return
		case u := <-ch:
			t.record(u.PodUIDs)
		case <-t.pause:
			select {
			case <-t.ctx.Done():
				return
			case <-t.resume:
			}
		}
	}
}

// pauseUpdates stops the drain goroutine until the next sync. The hand-over is an
// unbuffered send, so once this returns nothing reads Updates() but the next sync.
func (t *Twin) pauseUpdates() (reply, error) {
	if err := t.needStarted(); err != nil {
		return nil, err
	}
	if !t.paused {
		t.pause <- struct{}{}
		t.paused = true
	}
	return reply{"paused": true}, nil
}

func (t *Twin) record(uids []string) {
	sorted := append([]string(nil), uids...)
	sort.Strings(sorted)
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, uid := range sorted {
		t.announced[uid] = true
	}
	t.updates = append(t.updates, sorted)
	t.lastRecv = time.Now()
}

func (t *Twin) claims(req request) (reply, error) {
	if err := t.needStarted(); err != nil {
		return nil, err
	}
	names := []string{}
	for i, raw := range req.Claims {
		var claim resourceapi.ResourceClaim
		if err := json.Unmarshal(raw, &claim); err != nil {
			return nil, fmt.Errorf("claims[%d]: %w", i, err)
		}
		api := t.client.ResourceV1().ResourceClaims(claim.Namespace)
		_, err := api.Create(t.ctx, &claim, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			_, err = api.Update(t.ctx, &claim, metav1.UpdateOptions{})
		}
		if err != nil {
			return nil, fmt.Errorf("claims[%d] %s/%s: %w", i, claim.Namespace, claim.Name, err)
		}
		names = append(names, claim.Namespace+"/"+claim.Name)
	}
	return reply{"claims": names}, nil
}

func (t *Twin) register(req request) (reply, error) {
	if err := t.needStarted(); err != nil {
		return nil, err
	}
	// The kubelet's plugin watcher validates first and registers only a valid plugin.
	if err := t.line.Validate(t.ctx, t.manager, req.Driver, req.Endpoint, req.Services); err != nil {
		return nil, fmt.Errorf("ValidatePlugin: %w", err)
	}
	if err := t.line.Register(t.ctx, t.manager, req.Driver, req.Endpoint, req.Services); err != nil {
		return nil, fmt.Errorf("RegisterPlugin: %w", err)
	}
	return nil, nil
}

func (t *Twin) deregister(req request) (reply, error) {
	if err := t.needStarted(); err != nil {
		return nil, err
	}
	t.line.Deregister(t.ctx, t.manager, req.Driver, req.Endpoint)
	return nil, nil
}

func decodePod(raw json.RawMessage) (*v1.Pod, error) {
	if len(raw) == 0 {
		return nil, errors.New("pod is missing")
	}
	var pod v1.Pod
	if err := json.Unmarshal(raw, &pod); err != nil {
		return nil, fmt.Errorf("pod: %w", err)
	}
	return &pod, nil
}

func (t *Twin) prepare(req request, prepare bool) (reply, error) {
	if err := t.needStarted(); err != nil {
		return nil, err
	}
	pod, err := decodePod(req.Pod)
	if err != nil {
		return nil, err
	}
	if prepare {
		err = t.manager.PrepareResources(t.ctx, pod)
	} else {
		err = t.manager.UnprepareResources(t.ctx, pod)
	}
	if err != nil {
		// A refusal of the kubelet code is a normal reply (PROTOCOL.md).
		return reply{"error": err.Error()}, nil
	}
	return nil, nil
}

// DefaultSettle is the quiet time `sync` waits for when the request gives no settleMs.
// The manager writes the checkpoint and then sends the pod notification, so a sync right
// after a report must give the notification a moment to follow the write.
const DefaultSettle = 100 * time.Millisecond

// lastActivity is the later of the last notification and the checkpoint's last write.
func (t *Twin) lastActivity() time.Time {
	t.mu.Lock()
	last := t.lastRecv
	t.mu.Unlock()
	if info, err := os.Stat(filepath.Join(t.stateDir, HealthStateFile)); err == nil {
		if mod := info.ModTime(); mod.After(last) {
			last = mod
		}
	}
	return last
}

// settle waits until neither a notification nor a checkpoint write happened for `quiet`
// (at most 10 × quiet in all). Without recent activity it returns at once.
func (t *Twin) settle(quiet time.Duration) {
	if quiet <= 0 {
		return
	}
	deadline := time.Now().Add(10 * quiet)
	for {
		quietUntil := t.lastActivity().Add(quiet)
		now := time.Now()
		if !now.Before(quietUntil) || !now.Before(deadline) {
			return
		}
		wait := quietUntil.Sub(now)
		if d := deadline.Sub(now); d < wait {
			wait = d
		}
		time.Sleep(wait)
	}
}

func (t *Twin) sync(req request) (reply, error) {
	if err := t.needStarted(); err != nil {
		return nil, err
	}
	pods := make([]*v1.Pod, 0, len(req.Pods))
	for i, raw := range req.Pods {
		pod, err := decodePod(raw)
		if err != nil {
			return nil, fmt.Errorf("pods[%d]: %w", i, err)
		}
		pods = append(pods, pod)
	}
	quiet := DefaultSettle
	if req.SettleMs != nil {
		quiet = time.Duration(*req.SettleMs) * time.Millisecond
	}
	t.settle(quiet)
	// Take what is already in the channel too, so a notification sent before this
	// command is never reported one sync late.
	ch := t.manager.Updates()
	for more := true; more; {
		select {
		case u := <-ch:
			t.record(u.PodUIDs)
		default:
			more = false
		}
	}
	if t.paused {
		// The busy sync loop comes back: it reads what is buffered (above), then drains again.
		t.resume <- struct{}{}
		t.paused = false
	}
	t.mu.Lock()
	announced := make([]string, 0, len(t.announced))
	for uid := range t.announced {
		announced = append(announced, uid)
	}
	updates := t.updates
	t.announced, t.updates = map[string]bool{}, nil
	t.mu.Unlock()
	sort.Strings(announced)
	if updates == nil {
		updates = [][]string{}
	}

	statuses := map[string]any{}
	for _, pod := range pods {
		status := pod.Status.DeepCopy()
		t.line.UpdateStatus(t.logger, t.manager, pod, status)
		statuses[string(pod.UID)] = status
	}
	// Read right after the statuses, as the same sync point: each device as the manager's
	// getHealthInfo reads it (its own expiry, its own clock).
	devices := make([][2]string, 0, len(req.Devices))
	for _, d := range req.Devices {
		health, message := t.line.DeviceHealth(t.manager, d[0], d[1], d[2])
		devices = append(devices, [2]string{health, message})
	}
	return reply{"announced": announced, "updates": updates, "statuses": statuses, "devices": devices}, nil
}

// readState reads the checkpoint; the manager replaces it by rename, so a read never
// sees half a file.
func (t *Twin) readState() (any, string, error) {
	data, err := os.ReadFile(filepath.Join(t.stateDir, HealthStateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	var parsed any
	if err := json.Unmarshal(data, &parsed); err != nil {
		return nil, string(data), fmt.Errorf("%s is not JSON: %w", HealthStateFile, err)
	}
	return parsed, string(data), nil
}

func (t *Twin) state() (reply, error) {
	if err := t.needStarted(); err != nil {
		return nil, err
	}
	parsed, raw, err := t.readState()
	if err != nil {
		return nil, err
	}
	if parsed == nil && raw == "" {
		return reply{"state": nil, "raw": nil}, nil
	}
	return reply{"state": parsed, "raw": raw}, nil
}

// deviceEntry finds driver/pool/device in a parsed checkpoint.
func deviceEntry(parsed any, driver, pool, device string) (map[string]any, bool) {
	drivers, _ := parsed.(map[string]any)
	drv, _ := drivers[driver].(map[string]any)
	devices, _ := drv["Devices"].(map[string]any)
	entry, ok := devices[pool+"/"+device].(map[string]any)
	return entry, ok
}

func (t *Twin) matches(parsed any, req request) bool {
	entry, ok := deviceEntry(parsed, req.Driver, req.Pool, req.Device)
	if req.Absent {
		return !ok
	}
	if !ok {
		return false
	}
	if req.Health != nil && entry["Health"] != *req.Health {
		return false
	}
	if req.Message != nil {
		msg, _ := entry["Message"].(string)
		if msg != *req.Message {
			return false
		}
	}
	return true
}

// waitState polls the checkpoint until a device entry matches (or is absent), so the
// runner knows the manager has processed a report without a round trip per poll.
func (t *Twin) waitState(req request) (reply, error) {
	if err := t.needStarted(); err != nil {
		return nil, err
	}
	timeout := time.Duration(req.TimeoutMs) * time.Millisecond
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	deadline := time.Now().Add(timeout)
	for {
		parsed, raw, err := t.readState()
		if err == nil && t.matches(parsed, req) {
			return reply{"state": parsed, "raw": raw}, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("timed out after %v waiting for %s %s/%s in %s (last: %s)",
				timeout, req.Driver, req.Pool, req.Device, HealthStateFile, raw)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// shutdown stops the manager (where the line has Stop) and the drain goroutine.
func (t *Twin) shutdown() bool {
	if t.manager == nil {
		return false
	}
	stopped := t.line.Stop(t.manager)
	t.cancel()
	<-t.drained
	t.manager = nil
	return stopped
}
