"""The pure status core: claims and their devices, the kubelet-exact pod status, pod JSON
accessors and JSON pointers (the kubelet's ``pkg/kubelet/cm/dra`` claim info and
``pkg/kubelet/kuberuntime`` status parts). Nothing here does I/O."""
