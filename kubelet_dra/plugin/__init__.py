"""The drivers' side: the registration watcher and its validation, the plugin manager and
the health streams (``pkg/kubelet/cm/dra/plugin``)."""
