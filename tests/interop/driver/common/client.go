package common

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/clientcmd"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
)

// Client is the Kubernetes client handed to the helper. With no kubeconfig it is an
// in-memory fake into which UnaryInterceptor seeds an allocated ResourceClaim for every
// claim named in a NodePrepareResources call, so no API server is needed.
type Client struct {
	kubernetes.Interface
	fake *fake.Clientset
}

// NewClient builds a real client from kubeconfig, or the fake one if kubeconfig is empty.
func NewClient(kubeconfig string) (*Client, error) {
	if kubeconfig == "" {
		f := fake.NewClientset()
		return &Client{Interface: f, fake: f}, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Client{Interface: cs}, nil
}

type claimRef struct{ namespace, name, uid string }

func claimsOf(req any) []claimRef {
	var out []claimRef
	switch r := req.(type) {
	case *drapbv1.NodePrepareResourcesRequest:
		for _, c := range r.GetClaims() {
			out = append(out, claimRef{c.GetNamespace(), c.GetName(), c.GetUid()})
		}
	case *drapbv1beta1.NodePrepareResourcesRequest:
		for _, c := range r.GetClaims() {
			out = append(out, claimRef{c.GetNamespace(), c.GetName(), c.GetUid()})
		}
	}
	return out
}

func (c *Client) seed(ctx context.Context, claims []claimRef) {
	if c.fake == nil {
		return
	}
	for _, ref := range claims {
		claim := &resourcev1.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: ref.namespace, Name: ref.name, UID: types.UID(ref.uid)},
			Status:     resourcev1.ResourceClaimStatus{Allocation: &resourcev1.AllocationResult{}},
		}
		api := c.fake.ResourceV1().ResourceClaims(ref.namespace)
		_ = api.Delete(ctx, ref.name, metav1.DeleteOptions{})
		if _, err := api.Create(ctx, claim, metav1.CreateOptions{}); err != nil &&
			!apierrors.IsAlreadyExists(err) {
			Emit("seed_error", map[string]any{"claim": ref.name, "error": err.Error()})
		}
	}
}

func messageJSON(m any) any {
	msg, ok := m.(proto.Message)
	if !ok {
		return nil
	}
	data, err := protojson.Marshal(msg)
	if err != nil {
		return nil
	}
	return string(data)
}

// UnaryInterceptor reports every unary call (GetInfo, NotifyRegistrationStatus,
// NodePrepareResources, ...) as a "call" event and seeds fake claims before prepare.
func (c *Client) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo,
		handler grpc.UnaryHandler) (any, error) {
		c.seed(ctx, claimsOf(req))
		start := time.Now()
		resp, err := handler(ctx, req)
		fields := map[string]any{
			"method":      info.FullMethod,
			"request":     messageJSON(req),
			"response":    messageJSON(resp),
			"duration_ms": time.Since(start).Milliseconds(),
		}
		if err != nil {
			fields["error"] = err.Error()
		}
		Emit("call", fields)
		return resp, err
	}
}

// StreamInterceptor reports the opening and end of every streaming call.
func StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo,
		handler grpc.StreamHandler) error {
		Emit("stream_open", map[string]any{"method": info.FullMethod})
		err := handler(srv, ss)
		fields := map[string]any{"method": info.FullMethod}
		if err != nil {
			fields["error"] = err.Error()
		}
		Emit("stream_closed", fields)
		return err
	}
}

// PrepareList returns the devices to report from NodePrepareResources.
func PrepareList(c Control, driver string) []PreparedDevice {
	if len(c.PrepareDevices) > 0 {
		return c.PrepareDevices
	}
	out := make([]PreparedDevice, 0, len(c.Devices))
	for _, d := range c.Devices {
		out = append(out, PreparedDevice{
			Pool: d.Pool, Device: d.Device,
			CDIDeviceIDs: []string{fmt.Sprintf("%s/device=%s", driver, d.Device)},
		})
	}
	return out
}
