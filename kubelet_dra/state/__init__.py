"""What survives a restart: the health cache, its SQLite store, and the readers of the
kubelet's own checkpoints (``pkg/kubelet/cm/dra/state`` and ``healthinfo.go``)."""
