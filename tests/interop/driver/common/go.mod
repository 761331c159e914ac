// Code shared by both builds of the scripted interop test driver: flags, the JSON control
// file, event output and the claim-seeding fake client. It is compiled against whichever
// k8s.io versions the importing build module selects.
module kubelet-dra/tests/interop/driver/common

go 1.26.0

require (
	google.golang.org/grpc v1.72.2
	google.golang.org/protobuf v1.36.6
	k8s.io/api v0.35.10
	k8s.io/apimachinery v0.35.10
	k8s.io/client-go v0.35.10
	k8s.io/kubelet v0.35.10
)
