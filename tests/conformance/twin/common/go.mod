// The kubelet twin's shared code: the JSON-lines protocol around the kubelet's DRA manager and
// one small shim package per API shape (api134: 1.34-1.35, api136: 1.36, api137: 1.37+).
// It requires nothing itself: each per-line module decides every k8s.io version.
module kubelet-dra/tests/conformance/twin/common

go 1.24.0
